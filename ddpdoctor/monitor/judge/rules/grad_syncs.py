"""A rank that synchronizes DDP's gradients more often than the others (its `no_sync()`
accumulation differs): its extra gradient all-reduce has no partner.

Each forward outside `no_sync()` is counted per rank (collective `ddp_gradient_sync` of the group
`<group>:ddp_grads`, runtime/ddp_contract.py). The gradient all-reduces pair up with the others'
whatever their count (same buckets, same sizes), so the ranks keep going until the ones that
synced less have finished: then the others' next all-reduce has no partner, and the job fails
("Connection closed by peer") or hangs, in whichever rank got there. The verdict is a mismatch of
the ranks that went on to sync again after a peer ended cleanly with fewer syncs, at the line
that decides which forwards sync (the model's `no_sync()` call).
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, confirmed_mismatch
from ddpdoctor.monitor.model.snapshot import CollectiveView, RankView, Snapshot
from ddpdoctor.rank_ranges import named_ranks

SUFFIX = ":ddp_grads"
FIX = (
    "Give every rank the same gradient-accumulation count: the number of forwards under "
    "`model.no_sync()` between two synced ones must not depend on the rank (a per-rank config, "
    "a rank-dependent batch count). With Lightning set `accumulate_grad_batches` once for all "
    "ranks; with accelerate use `gradient_accumulation_steps` and `accelerator.accumulate(model)`."
)


def _syncs(view: RankView) -> dict[str, int]:
    return {g: s for g, s in view.group_seqs if g.endswith(SUFFIX)}


def _call(view: RankView, group: str, seq: int) -> CollectiveView | None:
    """The rank's sync numbered `seq`, else the first one it wrote after it: the runtime writes
    the count as it stands at each flush (several syncs in one record), with the line of the
    first sync after the previous flush."""
    after = [c for c in view.recent_collectives if c.group == group and c.seq >= seq]
    return min(after, key=lambda c: c.seq) if after else None


def detect(snap: Snapshot) -> RuleOutcome | None:
    ended = [v for v in snap.ranks if v.state.finished and v.exit_code == 0]
    if not ended:
        return None
    for group in sorted({g for v in ended for g in _syncs(v)}):
        done = min(_syncs(v).get(group, 0) for v in ended)
        ahead = [
            v
            for v in snap.ranks
            if not (v.state.finished and v.exit_code == 0) and _syncs(v).get(group, 0) > done
        ]
        if not ahead:
            continue
        culprits = tuple(sorted(v.rank for v in ahead))
        first = ahead[0]
        count = _syncs(first).get(group, 0)
        extra = _call(first, group, done + 1)
        finished = [v.rank for v in ended if _syncs(v).get(group, 0) == done]
        summary = (
            f"{named_ranks(list(culprits))} synchronized DDP gradients {count} times, "
            f"{named_ranks(finished)} only {done} times before finishing: the extra gradient "
            "all-reduce has no partner (a different gradient-accumulation count per rank)"
        )
        evidence: list[Evidence] = []
        if extra is not None and extra.site is not None:
            summary += f"; the synced forwards are decided at {extra.site.describe()}"
            evidence.append(
                Evidence(
                    f"rank {first.rank}: gradient sync #{done + 1} from {extra.site.describe()}",
                    extra.site.file or None,
                    extra.site.line,
                )
            )
        evidence.append(
            Evidence(
                "; ".join(f"rank {v.rank}: {_syncs(v).get(group, 0)} syncs" for v in snap.ranks[:8])
            )
        )
        onset = extra.since_t if extra is not None and extra.since_t else first.failed_t
        finding = Finding(
            id="ddp.gradient_sync_count",
            severity=Severity.ERROR,
            summary=summary,
            fix=FIX,
            ranks=culprits,
            evidence=tuple(evidence),
        )
        return confirmed_mismatch("grad_syncs", finding, onset)
    return None
