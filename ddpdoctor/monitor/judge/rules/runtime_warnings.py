"""Warning events from the ranks' runtime that no other rule interprets, passed on as findings."""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.rank_ranges import named_ranks

HANDLED = frozenset(
    {
        "sampler.set_epoch_missing",
        "sampler.uneven_batches",
        "init.world_size_mismatch",
        "spmd.contract_mismatch",
        "pipeline.contract_mismatch",
    }
)


def detect(snap: Snapshot) -> RuleOutcome | None:
    by_code: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for view in rank_index.of(snap).with_warnings:
        for code, message in view.warnings:
            if code not in HANDLED:
                by_code[code].append((view.rank, message))
    findings = []
    for code, items in sorted(by_code.items()):
        ranks = [r for r, _ in items]
        findings.append(
            Finding(
                id=code,
                severity=Severity.WARNING,
                summary=f"{items[0][1]} ({named_ranks(ranks)})",
                fix="See the message; ddpdoctor's runtime recorded it while the job ran.",
                ranks=tuple(ranks),
                evidence=tuple(Evidence(f"rank {r}: {m}") for r, m in items[:4]),
            )
        )
    return RuleOutcome(rule="warnings", findings=tuple(findings)) if findings else None
