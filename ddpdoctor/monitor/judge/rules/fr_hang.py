"""hang, from the flight recorder: ranks whose backend has collective #K scheduled and not
completed for longer than the hang threshold, while other ranks' backends never scheduled #K.

By default DDP's gradient all-reduce runs in C++ without an event per bucket, so a rank blocked
in backward shows no open collective in its events: the flight recorder, dumped by every rank at
the monitor's request, says where each backend is (ddpdoctor.protocol.flight_recorder). The
numbers are the backend's own per-group sequence numbers (collective_seq_id), which count every
collective of the group, DDP's included. How far each rank got is read as the post-mortem reads
it (ddpdoctor.protocol.fr_reading.last_scheduled).

A waiter counts when its dump, taken at the request, shows #K pending for at least the threshold;
a culprit when its dump, taken at least the threshold after the waiter scheduled #K, shows the
group's last scheduled number below K. Both dumps come from live ranks (a dump is the heartbeat
thread's answer), so a dead rank is left to the crash rule. Only the default group is judged
(see detect); a hang in a subgroup is left to the events.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.judge.rules import hang as hang_rule
from ddpdoctor.monitor.judge.rules.describe import stack_of, where_is
from ddpdoctor.monitor.judge.rules.hang import FIX
from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot, Verdict
from ddpdoctor.protocol.flight_recorder import FrEntry, FrRank
from ddpdoctor.protocol.fr_reading import last_scheduled
from ddpdoctor.rank_ranges import named_ranks

# Events and dumps carry the same rank's clock; a little slack for an event written in the same
# instant as the dump.
STALE_SLACK_S = 0.05


def detect(snap: Snapshot) -> RuleOutcome | None:
    th = snap.thresholds
    if th is None or not snap.flight_recorder:
        return None
    dumps = [d for d in snap.flight_recorder if d.error is None]
    best: RuleOutcome | None = None
    # The default group only: its id ("0") is the same on every rank, while a subgroup's id is
    # a per-process count that ranks outside it may not share.
    for pg in ("0",):
        outcome = _full_wait(snap, dumps, pg) or _blocked_wait(snap, dumps, pg)
        if outcome is not None and (
            best is None or (outcome.onset_t or 0.0) < (best.onset_t or 0.0)
        ):
            best = outcome
    return best


def _full_wait(snap: Snapshot, dumps: list[FrRank], pg: str) -> RuleOutcome | None:
    """Dumps taken the hang threshold after the waiters scheduled #K, ranks behind not busy."""
    th = snap.thresholds
    assert th is not None
    waiters: list[tuple[FrRank, FrEntry]] = []
    for d in dumps:
        entry = d.pending(pg)
        if entry is None or entry.created_t is None:
            continue
        if d.taken_t - entry.created_t >= th.hang_after_s:
            waiters.append((d, entry))
    if not waiters:
        return None
    k = min(e.seq for _, e in waiters)
    at_k = [(d, e) for d, e in waiters if e.seq == k]
    created = min(e.created_t or 0.0 for _, e in at_k)
    behind = []
    for d in dumps:
        group = d.group(pg)
        if group is None or last_scheduled(d, pg) >= k or not current(d, snap):
            continue
        view = snap.rank(d.rank)
        if view is not None and busy(view, snap):
            continue  # making progress of its own (eval, download): the others wait for it
        if d.taken_t - created >= th.hang_after_s:
            behind.append(d)
    if not behind:
        return None  # every backend scheduled #K (a transport stall), or the rest are busy
    return _outcome(snap, at_k, behind, created, pg, th.hang_after_s)


def _blocked_wait(snap: Snapshot, dumps: list[FrRank], pg: str) -> RuleOutcome | None:
    """The sooner threshold (thresholds.py): every rank behind #K is blocked, and has been for
    the whole wait. The dumps may be older than the threshold: a waiter's still stands while it
    has trained no further since (fr_wait.still_waiting's test), a culprit's while `current`."""
    th = snap.thresholds
    assert th is not None
    soonest = th.hang_blocked_after_s
    if soonest is None or soonest >= th.hang_after_s:
        return None
    waiters: list[tuple[FrRank, FrEntry]] = []
    for d in dumps:
        entry = d.pending(pg)
        view = snap.rank(d.rank)
        if entry is None or entry.created_t is None or view is None or view.state.finished:
            continue
        if not _trained_no_further(d, view):
            continue
        if snap.taken_t - entry.created_t >= soonest:
            waiters.append((d, entry))
    if not waiters:
        return None
    k = min(e.seq for _, e in waiters)
    at_k = [(d, e) for d, e in waiters if e.seq == k]
    created = min(e.created_t or 0.0 for _, e in at_k)
    waited = snap.taken_t - max(e.created_t or 0.0 for _, e in at_k)
    behind = []
    for d in dumps:
        group = d.group(pg)
        if group is None or last_scheduled(d, pg) >= k or not current(d, snap):
            continue
        view = snap.rank(d.rank)
        if view is None or not hang_rule.blocked_through(view, waited, snap):
            return None  # a rank behind that is not plainly blocked: the full threshold decides
        behind.append(d)
    if not behind:
        return None
    return _outcome(snap, at_k, behind, created, pg, soonest)


def _trained_no_further(dump: FrRank, view: RankView) -> bool:
    if dump.step is not None and view.step is not None:
        return view.step <= dump.step
    last = view.last_progress_t
    return last is None or last <= dump.taken_t + STALE_SLACK_S


def current(dump: FrRank, snap: Snapshot) -> bool:
    """The dump still says where a rank behind is: it has trained no further since. A dump taken
    while rank 0 evaluated says nothing once rank 0 has trained on: judging by it would name a
    healthy rank the culprit. One step more is allowed: a rank that ends (ddpdoctor's stop
    included) records the step it was in. Without the step in the answer, the time of the rank's
    latest progress decides."""
    view = snap.rank(dump.rank)
    if view is None:
        return False
    if dump.step is not None and view.step is not None:
        return view.step <= dump.step + 1
    last = view.last_progress_t
    return last is None or last <= dump.taken_t + STALE_SLACK_S


def busy(view: RankView, snap: Snapshot) -> bool:
    """A rank the events' hang rule would not call a culprit either: busy in its own code, or
    not judged yet by the progress model."""
    return hang_rule.progressing(view) or hang_rule.undecided(view, snap)


def culprit_line(d: FrRank, pg: str, entry: FrEntry) -> str:
    group = d.group(pg)
    last = f"last scheduled #{group.last_enqueued}" if group else "no collectives"
    completed = f", last completed #{group.last_completed}" if group else ""
    return (
        f"flight recorder, rank {d.rank}: its backend never started {entry.op} #{entry.seq}"
        f" ({last}{completed})"
    )


def waiter_line(d: FrRank, entry: FrEntry) -> str:
    age = d.taken_t - entry.created_t if entry.created_t is not None else None
    return (
        f"flight recorder, rank {d.rank}: {entry.backend} {entry.describe()} "
        f"{d.state_of(entry)} {fmt_s(age)} before the dump, not completed"
    )


def _outcome(
    snap: Snapshot,
    at_k: list[tuple[FrRank, FrEntry]],
    behind: list[FrRank],
    created: float,
    pg: str,
    after_s: float,
) -> RuleOutcome:
    th = snap.thresholds
    assert th is not None
    entry = at_k[0][1]
    waiter_ranks = sorted(d.rank for d, _ in at_k)
    culprit_ranks = sorted(d.rank for d in behind)
    longest = max(snap.taken_t - (e.created_t or d.taken_t) for d, e in at_k)
    views = [v for r in culprit_ranks if (v := snap.rank(r)) is not None]
    verb = "waits" if len(waiter_ranks) == 1 else "wait"
    summary = (
        f"{named_ranks(culprit_ranks)} never reached {entry.op} #{entry.seq}"
        f" ({named_ranks(waiter_ranks)} {verb} in it, {fmt_s(longest)}; flight recorder)"
    )
    if len(views) == 1:
        summary += f": {where_is(views[0], snap.stacks)}"
    evidence = [Evidence(culprit_line(d, pg, entry)) for d in behind[:8]]
    for view in views[:8]:
        evidence.append(Evidence(f"rank {view.rank}: {where_is(view, snap.stacks)}"))
        group = stack_of(view.rank, snap.stacks)
        if group is not None:
            frames = [f for f in group.frames if f][-6:]
            evidence.append(Evidence(f"rank {view.rank} stack: " + " > ".join(frames)))
    if len(behind) > 8:
        evidence.append(Evidence(f"... and {len(behind) - 8} more ranks behind"))
    evidence.extend(Evidence(waiter_line(d, e)) for d, e in at_k[:2])
    if after_s < th.hang_after_s:
        evidence.append(
            Evidence(
                f"threshold {fmt_s(after_s)}: every rank behind blocked (no CPU, no I/O, the same"
                f" frame) for the whole wait (else {fmt_s(th.hang_after_s)})"
            )
        )
    finding = Finding(
        id="hang",
        severity=Severity.ERROR,
        summary=summary,
        fix=FIX,
        ranks=tuple(culprit_ranks),
        evidence=tuple(evidence),
    )
    progress = [v.last_progress_t for v in views if v.last_progress_t is not None]
    started = min([created, *progress])
    return RuleOutcome(
        rule="fr_hang",
        findings=(finding,),
        verdict=Verdict.HANG,
        culprits=frozenset(culprit_ranks),
        started_t=started,
        onset_t=created + after_s,
        stalled=frozenset(
            v.rank for v in views if not v.state.finished and v.state is not RankState.WAITING
        ),
        waiting_on=tuple((r, tuple(culprit_ranks)[:16]) for r in waiter_ranks),
        confirmed=True,  # its culprits' backends never scheduled #K and they are not busy
    )
