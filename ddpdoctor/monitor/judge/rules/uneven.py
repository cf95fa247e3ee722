"""uneven_inputs: ranks ran different numbers of training steps when a problem hit (F31).

Evidence, strongest first: the ranks' loaders had different lengths this epoch (epoch events); a
rank finished training (exited normally) with fewer steps than a rank still training; step counts
more than one apart (one apart is normal: a rank may stop just before its step is counted).

A rank that died (the crash's culprits: killed, OOM, an error) stopped counting steps because it
died, not because its data ran out: its count is no evidence of uneven inputs.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

FIX = (
    "Give every rank the same number of batches: use DistributedSampler (it pads the data set to "
    "a multiple of the world size) with drop_last=True in the DataLoader where sizes still "
    "differ, or wrap the loop in the Join context manager "
    "(`with torch.distributed.algorithms.Join([model]):`) so ranks that run out early shadow the "
    "others' collectives."
)


def detect(
    snap: Snapshot, verdict: Verdict, *, died: frozenset[int] | None = None
) -> RuleOutcome | None:
    """`died`: the ranks whose own failure is the problem (a crash's culprits)."""
    if not verdict.is_problem:
        return None
    dead = died or frozenset()
    stepped = [
        v
        for v in snap.ranks
        if v.step is not None and not (v.rank in dead and v.state is not RankState.DONE)
    ]
    if len(stepped) < 2:
        return None
    evidence: list[Evidence] = []
    batches = _batches_of_one_loader(snap)
    uneven = False
    if len(set(batches.values())) > 1:
        uneven = True
        for rank, count in sorted(batches.items())[:8]:
            evidence.append(Evidence(f"rank {rank}: {count} batches this epoch"))
    lo = min(stepped, key=lambda v: v.step or 0)
    hi = max(stepped, key=lambda v: v.step or 0)
    spread = (hi.step or 0) - (lo.step or 0)
    finished_early = [
        v
        for v in stepped
        if v.state is RankState.DONE
        and any((o.step or 0) > (v.step or 0) and not o.state.finished for o in stepped)
    ]
    if spread >= 2 or finished_early:
        uneven = True
    if not uneven:
        return None
    for view in sorted(stepped, key=lambda v: v.rank)[:8]:
        state = " (finished)" if view.state is RankState.DONE else ""
        evidence.append(Evidence(f"rank {view.rank}: {view.step} steps{state}"))
    if len(set(batches.values())) > 1:
        # The loaders say who is short, whatever step each was in when the job was stopped
        few, many = min(batches.values()), max(batches.values())
        short = sorted(
            {r for r, n in batches.items() if n == few} | {v.rank for v in finished_early}
        )
        longest = [r for r, n in batches.items() if n == many][:1]
        summary = (
            f"uneven inputs: {named_ranks(short)} had {few} batches this epoch while "
            f"{named_ranks(longest)} had {many}"
        )
    else:
        short = sorted(
            {v.rank for v in stepped if v.step == lo.step} | {v.rank for v in finished_early}
        )
        summary = (
            f"uneven inputs: {named_ranks(short)} ran {lo.step} steps while "
            f"{named_ranks([hi.rank])} ran {hi.step}"
        )
    finding = Finding(
        id="uneven_inputs",
        severity=Severity.ERROR,
        summary=summary,
        fix=FIX,
        ranks=tuple(short),
        evidence=tuple(evidence),
    )
    return RuleOutcome(rule="uneven_inputs", findings=(finding,))


def _batches_of_one_loader(snap: Snapshot) -> dict[int, int]:
    """Each rank's batches this epoch in the same loader: the first loader (in the order the
    ranks made them) whose lengths differ among the ranks that iterated it, else the first that
    all iterated. A rank that alone went through another loader (rank 0's evaluation loader at
    an epoch's end) is not short of training batches. Ranks without loader ids: their latest."""
    views = [v for v in snap.ranks if v.epoch_batches is not None]
    if not all(v.loader_batches for v in views):
        return {v.rank: v.epoch_batches for v in views if v.epoch_batches is not None}
    per_rank = {v.rank: dict(v.loader_batches) for v in views}
    loaders = sorted({loader for counts in per_rank.values() for loader in counts})
    first: dict[int, int] = {}
    for loader in loaders:
        counts = {r: c[loader] for r, c in per_rank.items() if loader in c}
        if len(counts) < 2:
            continue  # one rank's loader alone: nothing to compare it with
        if len(set(counts.values())) > 1:
            return counts
        first = first or counts
    return first
