"""The SPMD contract differs across ranks (ddpdoctor/runtime/fingerprint.py): a mismatch before
the first collective that would show it.

The rank that compared the contracts wrote a warning event `spmd.contract_mismatch` whose
message ends in `[culprits 1,3; line FILE:LINE; t UNIX]`: the ranks that differ from the others
(or, where as many ranks stand on each side, the side that added a unit or froze a parameter),
the user's line that made the first differing entry, and when. Every collective of the model
pairs differently from then on (gloo aborts on a size check, NCCL hangs), so the verdict is a
mismatch of those ranks, named at that line, whichever rank trips first.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, confirmed_mismatch
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import Snapshot

CODE = "spmd.contract_mismatch"
FIX = (
    "Build the model the same way on every rank before the first forward: wrap the same "
    "modules with fully_shard (or DDP) in the same order, set requires_grad the same way on "
    "every rank, and give DDP the same find_unused_parameters / static_graph / bucket_cap_mb "
    "everywhere (Lightning: the same strategy, e.g. DDPStrategy(find_unused_parameters=True) or "
    'strategy="ddp_find_unused_parameters_true", on every rank; accelerate: the same '
    "DistributedDataParallelKwargs). Nothing that shapes the model may depend on the rank "
    "(`if rank == 0:`) or on rank-local data."
)


def parse(message: str) -> tuple[str, tuple[int, ...], str | None, int | None, float | None]:
    """(summary, culprits, file, line, t) from a contract message (bounded string operations)."""
    summary, sep, tail = message.rpartition(" [culprits ")
    if not sep or not tail.endswith("]"):
        return message, (), None, None, None
    culprits: list[int] = []
    file: str | None = None
    line: int | None = None
    t: float | None = None
    for part in tail[:-1].split("; ")[:3]:
        if part.startswith("line "):
            place, _, number = part[5:].rpartition(":")
            if place and number.isdigit():
                file, line = place, int(number)
        elif part.startswith("t "):
            try:
                t = float(part[2:])
            except ValueError:
                t = None
        else:
            culprits = [int(r) for r in part.split(",")[:1024] if r.isdigit()]
    return summary, tuple(culprits), file, line, t


def detect(snap: Snapshot) -> RuleOutcome | None:
    return from_warning(snap, CODE, FIX, "contract", "compared the ranks' contracts")


def from_warning(snap: Snapshot, code: str, fix: str, rule: str, said: str) -> RuleOutcome | None:
    """The confirmed mismatch a contract warning of `code` says (the SPMD contract's, the
    pipeline's: rules/pipeline_contract.py), from the first rank that wrote one."""
    for view in rank_index.of(snap).with_warnings:
        if not view.warnings:
            continue
        message = dict(view.warnings).get(code)
        if message is None:
            continue
        summary, culprits, file, line, t = parse(message)
        ranks = culprits or (view.rank,)
        evidence = [Evidence(f"rank {view.rank} {said}: {summary}")]
        if file is not None:
            evidence.insert(0, Evidence("the line that made it", file, line))
        finding = Finding(
            id=code,
            severity=Severity.ERROR,
            summary=summary,
            fix=fix,
            ranks=ranks,
            evidence=tuple(evidence),
        )
        onset = t if t is not None else view.last_progress_t
        return confirmed_mismatch(rule, finding, onset)
    return None
