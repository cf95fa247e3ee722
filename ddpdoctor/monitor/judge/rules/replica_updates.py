"""replicas.updates_differ: a ZeRO optimizer whose ranks updated its parameters differently.

Under ZeRO-1/2 (torch's ZeroRedundancyOptimizer) every rank holds every parameter, but each
updates only the partition it owns and then broadcasts it to the others. A write some ranks make
(a `load_state_dict` on rank 0 alone, an LR scheduler stepped under `if rank == 0`) therefore
never makes the replicas differ for long: at the next step the owners' broadcasts overwrite every
rank's copy. The digests agree again, yet the model is wrong: a mix of partitions reloaded and
not, or updated with different learning rates. What tells is the calls that write the replica
outside the optimizer (runtime/replica_calls.py), counted on each rank and sent with every
digest: at a step where the ZeRO optimizer's digests agree, a call into the model, its optimizer
or its scheduler that some ranks made more often than others is that error, with its line and the
step of its first call. Calls into anything else (a rank-0-only evaluation copy loaded from a
checkpoint) are not counted against it.

The verdict is a mismatch, never confirmed, like a divergence (replicas.py): the job is not
stopped unless the user asks.
"""

from __future__ import annotations

import dataclasses

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import replica_compare as base
from ddpdoctor.monitor.model.replicas import ReplicaDigest

UPDATES_DIFFER = "replicas.updates_differ"
FIX = (
    "Make every rank do the same to the model under ZeRO: step the LR scheduler and the "
    "optimizer on every rank, and load a checkpoint on every rank (or before the optimizer is "
    "built); each rank updates only the partition it owns, with its own settings."
)


def _into_model(digest: ReplicaDigest) -> ReplicaDigest:
    """The digest with only the calls that wrote into the model, its optimizer or scheduler."""
    return dataclasses.replace(digest, calls=tuple(c for c in digest.calls if c.ddp))


def updates_differ(ranks: base.Ranks, model: int) -> tuple[Finding, int] | None:
    """The first step at which a ZeRO optimizer's digests agree while the calls that wrote into
    it differ between its ranks, as a finding and that step; None if its digests ever differ
    (a divergence: replicas.py says it) or the calls never do."""
    by_step = base.by_step(ranks, model)
    seen = [by_step[step] for step in sorted(by_step)]
    final = base.finals(ranks, model)
    if final:
        seen.append(final)  # the end: a write late in a job whose digests are far apart
    latest = seen[-1] if seen else {}
    good: dict[int, ReplicaDigest] = {}
    for each in seen:
        digests = {rank: _into_model(d) for rank, d in each.items()}
        step = max(d.step for d in digests.values())
        if len(digests) < 2 or any(d.kind != "zero" for d in digests.values()):
            continue
        split = base.compare(step, digests)
        if not split.agree:
            return None
        blamed = base.culprit_call(digests, good, split)
        if blamed is None:
            good = digests
            continue
        call, makers, counts = blamed
        # said with the counts of the latest digests (how often, up to now)
        now = {r: base.calls_of(_into_model(latest[r])) for r in digests if r in latest}
        if len(now) == len(digests) and call.key in now[makers[0]]:
            counts = {r: base.count_of(calls, call.key) for r, calls in now.items()}
            call = now[makers[0]][call.key]
        text = base.call_text(call, makers, counts)
        site = call.site
        summary = (
            f"replicas updated differently: {base.what_of(next(iter(digests.values())))} "
            f"agree at step {step}, but {text}; ZeRO broadcasts each partition from the rank "
            "that owns it after every step, so the ranks hold the same model, a mix of "
            "partitions each rank updated its own way"
        )
        finding = Finding(
            id=UPDATES_DIFFER,
            severity=Severity.ERROR,
            summary=summary,
            fix=FIX,
            ranks=tuple(makers),
            evidence=(
                Evidence(text, site.file if site else None, site.line if site else None),
                Evidence(
                    f"step {step}: all {split.compared} parameters bit-identical on "
                    f"{base.named_ranks(sorted(digests))}"
                ),
            ),
        )
        return finding, step
    return None
