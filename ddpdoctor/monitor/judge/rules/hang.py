"""hang: ranks wait in collective #K while other ranks never reached #K and never will (F29, F31,
F39, F42).

The waiting ranks are alive (their heartbeats go on) but not progressing; the culprits are the
group members whose last sequence number in that group is below K and that are not making
progress of their own: blocked (ddpdoctor.monitor.model.progress: no CPU advance, no I/O and the same
frame across heartbeats), silent (heartbeat stopped), finished, or of unknown activity. Members
behind that are busy in their own code (rank 0 downloading, evaluating, checkpointing) are not
culprits: the others wait for them (the wait rule), and no hang is declared while every member
behind is busy. A rank that waits counts once its wait passes the hang threshold; a rank whose
heartbeat stopped is not "waiting", it is stalled or gone, and other rules speak for it.
"""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, call_sites, fmt_s
from ddpdoctor.monitor.judge.rules.describe import stack_of, where_is
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    RankState,
    RankView,
    Snapshot,
    Thresholds,
    Verdict,
)
from ddpdoctor.monitor.model.views_together import waiting_collective
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol.verdicts import ActivityState
from ddpdoctor.rank_ranges import named_ranks

FIX = (
    "Every rank must call the same collectives in the same order. Look at what the culprit is "
    "doing instead (its phase, last event and stack): a collective or a DDP forward under "
    "`if rank == 0`, uneven data per rank (use DistributedSampler / drop_last / the Join context "
    "manager), a stuck DataLoader worker, or slow rank-only work (eval, checkpoint) that needs "
    "the others to wait longer. Without ddpdoctor, PyTorch waits 600 s (NCCL) or 1800 s (gloo) "
    "before the watchdog fails the job."
)


def long_waiters(
    snap: Snapshot, after_s: float | None = None
) -> dict[str, list[tuple[RankView, CollectiveView]]]:
    """Per group, the ranks that have waited in a collective past `after_s` (the hang
    threshold unless given), alive."""
    th = snap.thresholds
    out: dict[str, list[tuple[RankView, CollectiveView]]] = defaultdict(list)
    if th is None:
        return out
    if after_s is None:
        after_s = th.hang_after_s
    for view in rank_index.of(snap).in_collective:
        if view.collective is None:
            continue
        coll = waiting_collective(view)
        if coll is None or coll.waiting_s < after_s:
            continue
        if heartbeat_alive_while_waiting(view, coll, snap):
            out[coll.group].append((view, coll))
    return out


def heartbeat_alive_while_waiting(view: RankView, coll: CollectiveView, snap: Snapshot) -> bool:
    """The rank kept its heartbeat going until the wait passed the threshold (alive, not dead)."""
    th = snap.thresholds
    assert th is not None
    if view.last_heartbeat_t is None:
        return view.alive is True  # no heartbeat thread: trust the pid
    if (
        coll.since_t is not None
        and view.last_heartbeat_t < coll.since_t + th.hang_after_s - th.heartbeat_stale_s
    ):
        return False
    if not view.state.finished and view.heartbeat_age_s is not None:
        return view.heartbeat_age_s <= th.heartbeat_stale_s
    return True


def progressing(view: RankView) -> bool:
    """The rank is alive and making progress in its own code (busy, or its GPU works)."""
    return not view.state.finished and view.activity is not None and view.activity.state.progressing


def undecided(view: RankView, snap: Snapshot) -> bool:
    """Its heartbeats report progress facts, fresh, but too few yet to judge it (it has just
    started, or the machine is slow): not a culprit until they tell, a few seconds at most."""
    th = snap.thresholds
    fresh = (
        th is not None
        and view.heartbeat_age_s is not None
        and view.heartbeat_age_s <= th.heartbeat_stale_s
    )
    return view.activity is None and view.reports_progress and fresh and not view.state.finished


def blocked_through(view: RankView, waited_s: float, snap: Snapshot) -> bool:
    """The rank is blocked (no CPU, no I/O, the same frame) and has been for the whole wait but
    one heartbeat period (the interval in which it stopped is active by its earlier work)."""
    th = snap.thresholds
    activity = view.activity
    if th is None or activity is None or view.state.finished:
        return False
    if activity.state is not ActivityState.BLOCKED or activity.since_s is None:
        return False
    return activity.since_s + th.heartbeat_period_s >= waited_s


def soonest_after(th: Thresholds) -> float:
    """The earliest a wait can be a hang: the sooner threshold, which only a culprit blocked
    for the whole wait earns (`blocked_through`); every other culprit takes hang_after_s."""
    return min(th.hang_after_s, th.hang_blocked_after_s or th.hang_after_s)


def members_of(coll: CollectiveView, snap: Snapshot) -> list[int]:
    if coll.group == ev.DEFAULT_GROUP or not coll.group_ranks:
        return [v.rank for v in snap.ranks]
    return [r for r in coll.group_ranks if snap.rank(r) is not None]


def detect(snap: Snapshot) -> RuleOutcome | None:
    th = snap.thresholds
    if th is None:
        return None
    best: RuleOutcome | None = None
    soonest = soonest_after(th)
    for group, waiters in long_waiters(snap, soonest).items():
        k = min(c.seq for _, c in waiters)
        at_k = [(v, c) for v, c in waiters if c.seq == k]
        waited = min(c.waiting_s for _, c in at_k)
        coll = at_k[0][1]
        behind = []
        for m in members_of(coll, snap):
            view = snap.rank(m)
            if view is not None and view.seq_in(group) < k:
                behind.append(view)
        if not behind:
            continue  # everyone reached #K: a transport stall or a mismatch, not this rule
        stuck = [v for v in behind if not progressing(v) and not undecided(v, snap)]
        if not stuck:
            continue  # every rank behind is busy (a wait: rules.wait) or not judged yet
        after = th.hang_after_s
        if waited < after:  # sooner only on the evidence that nothing moved on any rank behind
            if not all(blocked_through(v, waited, snap) for v in stuck):
                continue
            after = soonest
        waiting = [v for v, _ in waiters]
        divergence = _divergence(snap, coll, waiting, stuck)
        outcome = _outcome(snap, coll, waiting, stuck, divergence, after)
        if best is None or (outcome.onset_t or 0) < (best.onset_t or 0):
            best = outcome
    return best


def _divergence(
    snap: Snapshot, coll: CollectiveView, waiters: list[RankView], stuck: list[RankView]
) -> call_sites.Divergence | None:
    """Where the call sites say the hang began: an extra call of the waiting side that the
    others, which then ended cleanly, never made; or an earlier extra call that the transport
    paired with another (gloo pairs any two barriers), after which the ranks were out of step."""
    ended = call_sites.ended_divergence(waiters, coll, stuck)
    if ended is not None:
        return ended
    earlier = call_sites.first_divergence(snap)
    if earlier is not None and earlier.group == coll.group and earlier.seq <= coll.seq:
        return earlier
    return None


def _outcome(
    snap: Snapshot,
    coll: CollectiveView,
    waiters: list[RankView],
    culprits: list[RankView],
    divergence: call_sites.Divergence | None = None,
    after_s: float | None = None,
) -> RuleOutcome:
    th = snap.thresholds
    assert th is not None
    after = after_s if after_s is not None else th.hang_after_s
    since = min(
        (w.collective.since_t for w in waiters if w.collective and w.collective.since_t),
        default=None,
    )
    onset = since + after if since is not None else snap.taken_t
    progress = [c.last_progress_t for c in culprits if c.last_progress_t is not None]
    started = min(progress) if progress else since
    if started is not None and since is not None:
        started = min(started, since)
    longest = max(w.collective.waiting_s for w in waiters if w.collective)
    culprit_ranks = [c.rank for c in culprits]
    waiter_ranks = [w.rank for w in waiters]
    who = named_ranks(culprit_ranks)
    verb = "waits" if len(waiters) == 1 else "wait"
    summary = (
        f"{who} never reached {coll.describe()}"
        f" ({named_ranks(waiter_ranks)} {verb} in it, {fmt_s(longest)})"
    )
    if len(culprits) == 1:
        summary += f": {where_is(culprits[0], snap.stacks)}"
        if culprits[0].activity is not None:
            summary += f"; {culprits[0].activity.describe()}"
    evidence = []
    for view in culprits[:8]:
        evidence.append(Evidence(f"rank {view.rank}: {where_is(view, snap.stacks)}"))
        if view.activity is not None:
            evidence.append(
                Evidence(
                    f"rank {view.rank}: {view.activity.describe()} for {fmt_s(view.activity.since_s)}"
                )
            )
        group = stack_of(view.rank, snap.stacks)
        if group is not None:
            frames = [f for f in group.frames if f][-6:]
            evidence.append(Evidence(f"rank {view.rank} stack: " + " > ".join(frames)))
    if len(culprits) > 8:
        evidence.append(Evidence(f"... and {len(culprits) - 8} more ranks behind"))
    for view in waiters[:2]:
        evidence.append(
            Evidence(
                f"rank {view.rank}: waits in {view.collective.describe() if view.collective else '?'}"
                f" for {fmt_s(view.collective.waiting_s if view.collective else None)}"
                f" (threshold {fmt_s(after)}"
                f"{', every rank behind blocked' if after < th.hang_after_s else ''};"
                " heartbeat alive)"
            )
        )
    waiting_on = tuple((w.rank, tuple(sorted(culprit_ranks))[:16]) for w in waiters)
    if divergence is not None:
        # the call sites name the rank that made the extra call, and its line
        if divergence.others_ended:
            summary = (
                f"{divergence.describe()} ({named_ranks(waiter_ranks)} {verb} in it,"
                f" {fmt_s(longest)})"
            )
        else:
            summary = f"{divergence.describe()}; then {summary}"
        evidence[:0] = divergence.evidence()
        culprit_ranks = list(divergence.culprits)
    finding = Finding(
        id="hang",
        severity=Severity.ERROR,
        summary=summary,
        fix=FIX,
        ranks=tuple(sorted(culprit_ranks)),
        evidence=tuple(evidence),
    )
    stalled = frozenset(
        c.rank for c in culprits if not c.state.finished and c.state is not RankState.WAITING
    )
    return RuleOutcome(
        rule="hang",
        findings=(finding,),
        verdict=Verdict.HANG,
        culprits=frozenset(culprit_ranks),
        started_t=started,
        onset_t=onset,
        stalled=stalled,
        waiting_on=waiting_on,
        confirmed=True,  # its culprits are blocked, silent, finished or of unknown activity
    )
