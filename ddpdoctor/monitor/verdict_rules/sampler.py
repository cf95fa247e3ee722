"""sampler: DistributedSampler misuse seen before it bites (F36, F31).

`sampler.set_epoch_missing`: the runtime's audit saw a full pass run again without set_epoch while
shuffling, so every epoch repeats the same order. `sampler.uneven_batches`: the ranks' loaders have
different lengths this epoch, so some rank will run out of batches first and the others will hang
in their next collective.
"""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.snapshot import Snapshot
from ddpdoctor.monitor.verdict_rules import RuleOutcome
from ddpdoctor.rank_ranges import named_ranks

SET_EPOCH = "sampler.set_epoch_missing"
UNEVEN = "sampler.uneven_batches"

FIX_SET_EPOCH = (
    "Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the "
    "DataLoader; otherwise DistributedSampler shuffles every epoch the same way."
)
FIX_UNEVEN = (
    "Give every rank the same number of batches: DistributedSampler (pads to a multiple of the "
    "world size), drop_last=True, or the Join context manager for inputs that cannot be evened."
)


def detect(snap: Snapshot) -> RuleOutcome | None:
    findings = []
    missing = [v for v in snap.ranks if any(code == SET_EPOCH for code, _ in v.warnings)]
    if missing:
        message = next(m for code, m in missing[0].warnings if code == SET_EPOCH)
        findings.append(
            Finding(
                id=SET_EPOCH,
                severity=Severity.WARNING,
                summary=f"DistributedSampler.set_epoch() is not called ({named_ranks(v.rank for v in missing)}): "
                "every epoch sees the data in the same order",
                fix=FIX_SET_EPOCH,
                ranks=tuple(v.rank for v in missing),
                evidence=(Evidence(message),),
            )
        )
    batches: dict[int, list[int]] = defaultdict(list)
    for view in snap.ranks:
        if view.epoch_batches is not None:
            batches[view.epoch_batches].append(view.rank)
    if len(batches) > 1:
        lo = min(batches)
        hi = max(batches)
        findings.append(
            Finding(
                id=UNEVEN,
                severity=Severity.WARNING,
                summary=f"ranks have different numbers of batches per epoch: {named_ranks(batches[lo])} "
                f"{lo}, {named_ranks(batches[hi])} {hi}; the ranks with more will wait forever in "
                "their last collectives",
                fix=FIX_UNEVEN,
                ranks=tuple(sorted(batches[lo])),
                evidence=tuple(
                    Evidence(f"{named_ranks(ranks)}: {count} batches")
                    for count, ranks in sorted(batches.items())
                ),
            )
        )
    return RuleOutcome(rule="sampler", findings=tuple(findings)) if findings else None
