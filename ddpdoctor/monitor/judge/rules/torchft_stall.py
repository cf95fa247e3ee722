"""torchft: a replica that stalls in its own code is a hang of its replica group.

In plain DDP a stalled rank shows as its peers waiting in the collective it never reaches (the
hang rule). torchft does not wait for it: the peers' collective fails at the process group's
timeout, the lighthouse forms the next quorum without the replica, and the other groups train
on, while the stalled replica (its manager still heartbeating to the lighthouse) never takes
part again. So a rank of a torchft run is a hang's culprit by itself when, for longer than the
hang threshold:

- its heartbeat goes on (it is alive) and it made no progress (no step, collective or quorum
  event),
- it is blocked (no CPU advance, no I/O, the same frame: ddpdoctor.monitor.model.progress), in
  its own code (its innermost frame is the user's line: a sleep, a lock, a read), not in
  torchft's or the standard library's waiting for a quorum or a peer,
- and it had trained (a step or a collective) before.

A rank blocked for all of that time (rules.hang.blocked_through) is one past the sooner threshold
(hang_blocked_after_s), as a collective's blocked culprit is: nothing on it moved while it made
no progress. The finding names the replica group, the rank and the line it is blocked at.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.judge.rules.describe import stack_of, where_is
from ddpdoctor.monitor.judge.rules.hang import blocked_through, soonest_after
from ddpdoctor.monitor.model.snapshot import RankView, Snapshot, Verdict
from ddpdoctor.protocol.verdicts import ActivityState
from ddpdoctor.rank_ranges import named_ranks

FIX = (
    "The replica is blocked in its own code (the line above): a sleep, a lock, a queue or a read "
    "that never returns. torchft goes on without it, but it holds its replica group's place and "
    "never trains again; fix the wait, or give it a timeout that raises, so that its torchrun "
    "restarts it and it heals from a peer."
)


def _stalled(view: RankView, snap: Snapshot) -> tuple[float, float] | None:
    """(how long the rank has been stalled in its own code, the threshold that time passed), or
    None when it is not stalled."""
    th = snap.thresholds
    activity = view.activity
    if th is None or activity is None or view.state.finished:
        return None
    if activity.state is not ActivityState.BLOCKED or view.collective is not None:
        return None  # busy, or waiting in a collective: the hang and wait rules speak for it
    if not activity.where or activity.frame != activity.where:
        return None  # blocked in torchft or the standard library: waiting for a peer or quorum
    if not (view.step or view.collectives_done):
        return None  # not trained yet: starting up
    if view.heartbeat_age_s is None or view.heartbeat_age_s > th.heartbeat_stale_s:
        return None  # silent: dead or frozen, other rules speak for it
    if view.last_progress_t is None:
        return None
    quiet = snap.taken_t - view.last_progress_t
    if quiet >= th.hang_after_s:
        return quiet, th.hang_after_s
    # sooner only when it was blocked all along: blocked since a moment ago, it was doing
    # something (a read that returned, a lock taken) for most of its quiet time
    soonest = soonest_after(th)
    if quiet >= soonest and blocked_through(view, quiet, snap):
        return quiet, soonest
    return None


def detect(snap: Snapshot) -> RuleOutcome | None:
    tf = snap.torchft
    th = snap.thresholds
    if tf is None or th is None:
        return None
    stalled: list[tuple[RankView, float, float]] = []
    for view in snap.ranks:
        found = _stalled(view, snap) if tf.group_of(view.rank) is not None else None
        if found is not None:
            stalled.append((view, *found))
    if not stalled:
        return None
    culprits = [v for v, _, _ in stalled]
    first = culprits[0]
    longest = max(q for _, q, _ in stalled)
    group = tf.group_of(first.rank)
    going_on = [
        v.rank
        for v in snap.ranks
        if v not in culprits and not v.state.finished and tf.group_of(v.rank) != group
    ]
    summary = (
        f"{named_ranks(v.rank for v in culprits)} (replica group {group}) stalled: no progress "
        f"for {fmt_s(longest)}, {where_is(first, snap.stacks)}"
    )
    if first.activity is not None:
        summary += f"; {first.activity.describe()}"
    if going_on:
        summary += f"; torchft trains on without it ({named_ranks(going_on)})"
    evidence = []
    for view, quiet, _ in stalled[:8]:
        where = view.activity.where if view.activity else None
        evidence.append(Evidence(f"rank {view.rank}: blocked at {where} for {fmt_s(quiet)}"))
        stack = stack_of(view.rank, snap.stacks)
        if stack is not None:
            frames = [f for f in stack.frames if f][-6:]
            evidence.append(Evidence(f"rank {view.rank} stack: " + " > ".join(frames)))
    # the onset is the first culprit's to pass its threshold, each by its own (_stalled gives
    # only ranks with a last progress)
    onsets = [
        (v.last_progress_t + after, after)
        for v, _, after in stalled
        if v.last_progress_t is not None
    ]
    onset, after = min(onsets) if onsets else (snap.taken_t, th.hang_after_s)
    sooner = [v.rank for v, _, used in stalled if used < th.hang_after_s]
    blocked = f", {named_ranks(sooner)} blocked" if after < th.hang_after_s else ""
    evidence.append(Evidence(f"threshold {fmt_s(after)}{blocked} ({th.basis})"))
    progress = [v.last_progress_t for v in culprits if v.last_progress_t is not None]
    started = min(progress) if progress else None
    return RuleOutcome(
        rule="hang",
        findings=(
            Finding(
                "torchft.replica_stalled",
                Severity.ERROR,
                summary,
                FIX,
                ranks=tuple(sorted(v.rank for v in culprits)),
                evidence=tuple(evidence),
            ),
        ),
        verdict=Verdict.HANG,
        culprits=frozenset(v.rank for v in culprits),
        started_t=started,
        onset_t=onset,
        stalled=frozenset(v.rank for v in culprits),
        confirmed=True,  # blocked across heartbeats, in its own code, alive
    )
