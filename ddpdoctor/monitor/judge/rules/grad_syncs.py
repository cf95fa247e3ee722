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
from ddpdoctor.monitor.judge.rules import crash as crash_rule
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import CollectiveView, RankState, RankView, Snapshot
from ddpdoctor.rank_ranges import named_ranks

SUFFIX = ":ddp_grads"
FIX = (
    "Give every rank the same gradient-accumulation count: the number of forwards under "
    "`model.no_sync()` (or with require_backward_grad_sync=False) between two synced ones must "
    "not depend on the rank (a per-rank config, a rank-dependent batch count). Lightning: "
    "Trainer(accumulate_grad_batches=N) with the same N on every rank; accelerate: "
    "Accelerator(gradient_accumulation_steps=N) and `with accelerator.accumulate(model):`, the "
    "same N everywhere (accelerator.no_sync(model) only on steps every rank skips)."
)


def _syncs(view: RankView) -> dict[str, int]:
    return {g: s for g, s in view.group_seqs if g.endswith(SUFFIX)}


def _call(view: RankView, group: str, seq: int) -> CollectiveView | None:
    """The rank's sync numbered `seq`, else the first one it wrote after it: the runtime writes
    the count as it stands at each flush (several syncs in one record), with the line of the
    first sync after the previous flush."""
    after = [c for c in view.recent_collectives if c.group == group and c.seq >= seq]
    return min(after, key=lambda c: c.seq) if after else None


# (the states, looked up once: this is asked of every rank at every poll)
_FAILED, _GONE = RankState.FAILED, RankState.GONE


def _left(view: RankView) -> bool:
    """The rank stopped syncing: it ended cleanly, or was stopped as a consequence (torchrun's
    SIGTERM after a peer failed, a peer's closed connection) with no error of its own."""
    state = view.state
    if view.exit_code == 0 and state.finished:
        return True
    return (state is _FAILED or state is _GONE) and crash_rule.looks_like_consequence(view)


def detect(snap: Snapshot) -> RuleOutcome | None:
    """Ranks that synced more often than peers that stopped syncing: the peers ended (cleanly,
    or stopped as a consequence when the extra sync failed), whichever the machine let finish
    first. Any failure of a rank's own (not an echo of a peer's) leaves the verdict to the
    crash rule: a rank one sync ahead of a rank that really crashed is no mismatch."""
    if any(_own_failure(v) for v in crash_rule.failures(snap)):
        return None
    # (a rank that left has finished: it is among the unsettled)
    low = [v for v in rank_index.of(snap).unsettled if _left(v)]
    if not low:
        return None
    for group in sorted({g for v in snap.ranks for g in _syncs(v)}):
        done = min(_syncs(v).get(group, 0) for v in low)
        ahead = [v for v in snap.ranks if _syncs(v).get(group, 0) > done]
        finished = [v for v in low if _syncs(v).get(group, 0) == done]
        if ahead and all(_stuck_in_sync(v) for v in ahead) and _ended_first(finished, ahead):
            return _outcome(
                snap, group, ahead, [v.rank for v in finished], done, "before finishing"
            )
    return None


def _stuck_in_sync(view: RankView) -> bool:
    """Still running (waiting for a partner), or failed because its peer went away: not stopped
    from outside (a Ctrl-C reaches every rank, one sync ahead of another or not)."""
    if not view.state.finished:
        return True
    if view.exit_signal in crash_rule.EXTERNAL_SIGNALS or view.exit_reason == "signal":
        return False
    return view.exit_code != 0


def _own_failure(view: RankView) -> bool:
    """An error of the rank's own (not an echo of a peer's going away), or a deadly signal."""
    if view.error:
        return not crash_rule.looks_like_consequence(view)
    return view.exit_signal is not None and view.exit_signal not in crash_rule.EXTERNAL_SIGNALS


def _ended_first(finished: list[RankView], ahead: list[RankView]) -> bool:
    """A rank with fewer syncs ended cleanly, or was stopped only after an extra sync failed."""
    if any(v.state.finished and v.exit_code == 0 for v in finished):
        return True
    failed = [v.failed_t for v in ahead if v.failed_t is not None]
    return bool(failed) and any(
        v.failed_t is not None and v.failed_t >= min(failed) for v in finished
    )


def extra_syncs(snap: Snapshot, side: list[int], rest: list[int]) -> RuleOutcome | None:
    """The ranks of `side`, in a call other than `rest`'s (the flight recorder says so), synced
    DDP's gradients more often than every rank of `rest`: their gradient all-reduce is the extra
    call (a different accumulation count), whatever the others went on to (a barrier, the end)."""
    views = [snap.rank(r) for r in side]
    others = [snap.rank(r) for r in rest]
    if any(v is None for v in views) or any(v is None for v in others) or not others:
        return None
    if not _same_stretch(views + others):
        return None
    for group in sorted({g for v in views if v for g in _syncs(v)}):
        most = max(_syncs(v).get(group, 0) for v in others if v)
        # One sync ahead of a rank in another collective is also what a rank a step ahead
        # looks like when the other stopped before its forward for an extra call of its own
        # (a barrier or an all_reduce under `if rank == 1`): by the counts alone the two read
        # alike, so one ahead needs the steps' forwards to say so (fewer micro-batches per
        # sync); two or more is more syncs per batch.
        least = min(_syncs(v).get(group, 0) for v in views if v)
        if least <= most or (least == most + 1 and not _fewer_forwards_per_sync(views, others)):
            continue
        if all(_syncs(v).get(group, 0) > most for v in views if v):
            ahead = [v for v in views if v]
            return _outcome(snap, group, ahead, list(rest), most, "while the others went on")
    return None


def _fewer_forwards_per_sync(side: list[RankView | None], rest: list[RankView | None]) -> bool:
    """Every rank of `side` synced after fewer forwards than every rank of `rest` (the forwards
    of each one's latest step: a step is one sync and the micro-batches under `no_sync()` before
    it): it accumulates over fewer micro-batches, so its extra sync is no step ahead of a peer
    that stopped for a call of its own (that peer's steps have as many forwards)."""
    mine = [v.step_forwards for v in side if v is not None]
    theirs = [v.step_forwards for v in rest if v is not None]
    if not mine or not theirs or not all(mine) or not all(theirs):
        return False  # unknown on some rank (no step recorded yet): no evidence
    return max(n for n in mine if n) < min(n for n in theirs if n)


def _same_stretch(views: list[RankView | None]) -> bool:
    """The ranks are in the same stretch of training (the same epoch where known, no rank in an
    evaluation): a rank whose peers moved on to the next epoch, or that evaluates, is in a call
    of its own (`gather_for_metrics` under `is_main_process` at an epoch's end), and the peers'
    next gradient sync is no extra one."""
    epochs = {v.epoch for v in views if v is not None and v.epoch is not None}
    phases = {v.phase for v in views if v is not None and v.phase}
    return len(epochs) <= 1 and not any("eval" in p or "val" in p for p in phases)


def _outcome(
    snap: Snapshot, group: str, ahead: list[RankView], finished: list[int], done: int, how: str
) -> RuleOutcome:
    culprits = tuple(sorted(v.rank for v in ahead))
    first = ahead[0]
    count = _syncs(first).get(group, 0)
    extra = _call(first, group, done + 1)
    summary = (
        f"{named_ranks(list(culprits))} synchronized DDP gradients {count} times, "
        f"{named_ranks(finished)} only {done} times {how}: the extra gradient "
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
    return confirmed_mismatch("grad_syncs", finding, onset or snap.taken_t)
