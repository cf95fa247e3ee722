"""sampler: DistributedSampler misuse seen before it bites (F36, F31).

`sampler.set_epoch_missing`: the runtime's audit saw a full pass run again without set_epoch while
shuffling, so every epoch repeats the same order. `sampler.uneven_batches`: the same loader (matched by
id across ranks) has different lengths on different ranks this epoch, so some rank will run out of
batches first and the others will hang in their next collective. A loader iterated inside torch's
`with Join(...)` is not compared (its epoch event says `join`): Join evens such ranks by design.
"""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import Snapshot
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
    missing = [
        v
        for v in rank_index.of(snap).with_warnings
        if v.warnings and any(code == SET_EPOCH for code, _ in v.warnings)
    ]
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
    batches = _uneven_loader(snap)
    if batches:
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


def _uneven_loader(snap: Snapshot) -> dict[int, list[int]]:
    """batches -> ranks, for the first DataLoader that ranks iterate with different lengths.

    Loaders are matched by id (each rank counts its loaders in the order it makes them), and only
    between the ranks that have that loader: an evaluation loader that only rank 0 makes (the
    tutorials' rank-0 evaluation) is not the others' training loader and is never compared.
    """
    index = rank_index.of(snap)
    if index.narrow and _all_alike(index.loader_batches):
        return {}  # (every rank's loaders have the batches of every other's: nothing differs)
    per_loader: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for view in index.with_loader_batches:
        for loader, count in view.loader_batches:
            per_loader[loader][count].append(view.rank)
    for loader in sorted(per_loader):
        if len(per_loader[loader]) > 1:
            return dict(per_loader[loader])
    return {}


def _all_alike(batches: list[tuple[tuple[int, int], ...]]) -> bool:
    """Whether every rank's (loader, batches) pairs equal the first rank's, in which no loader
    comes twice: then each loader has one count, and the walk over the ranks finds none uneven
    (a comparison of tuples in C for each rank, where the walk makes dicts of lists in Python)."""
    if not batches:
        return True
    first = batches[0]
    return batches.count(first) == len(batches) and len({i for i, _ in first}) == len(first)
