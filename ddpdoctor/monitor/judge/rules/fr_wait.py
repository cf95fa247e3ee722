"""Waits the flight recorder shows: ranks whose backend has a collective pending while other
ranks' backends never scheduled it.

By default DDP's gradient all-reduce runs in C++ with no event per bucket, so a rank waiting in
backward for a rank that is still evaluating shows no open collective in its events, and the
events' wait rule cannot list it. The monitor asks every rank for its flight-recorder dump as soon
as one rank has made no progress for the waiting threshold (ddpdoctor.monitor.follow.fr_collector), and
the dumps say who waits in which collective and who has not reached it: the same pairs the wait
rule lists from events. Whether it is a wait or a hang stays the progress model's call (the wait
rule and fr_hang decide alike: busy ranks behind make a wait).

A dump stands for a waiter only while the waiter has trained no further since it took it (its
step count in the answer), and for a rank behind only while fr_hang.current holds. Only the
default group is read, as in fr_hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.monitor.judge.rules.fr_hang import STALE_SLACK_S, current
from ddpdoctor.monitor.model.snapshot import CollectiveView, RankView, Snapshot
from ddpdoctor.protocol.flight_recorder import FrEntry, FrRank, dtype_name
from ddpdoctor.protocol.fr_reading import last_scheduled

DEFAULT_PG = "0"


@dataclass(frozen=True)
class FrWait:
    """Ranks waiting in one collective (as the longest waiter's backend recorded it) for ranks
    whose backends have not scheduled it."""

    waiters: tuple[RankView, ...]
    behind: tuple[RankView, ...]
    collective: CollectiveView


def fr_waits(snap: Snapshot, skip: frozenset[int] = frozenset()) -> list[FrWait]:
    """The waits past the waiting threshold that the latest dumps show, longest first; ranks in
    `skip` (their events already show the collective they wait in) are not read as waiters."""
    th = snap.thresholds
    if th is None or not snap.flight_recorder:
        return []
    dumps = [d for d in snap.flight_recorder if d.error is None]
    by_seq: dict[int, list[tuple[RankView, FrEntry]]] = {}
    for d in dumps:
        if d.rank in skip:
            continue
        entry = d.pending(DEFAULT_PG)
        view = snap.rank(d.rank)
        if entry is None or entry.created_t is None or view is None:
            continue
        if view.state.finished or not still_waiting(d, view):
            continue
        if snap.taken_t - entry.created_t >= th.waiting_after_s:
            by_seq.setdefault(entry.seq, []).append((view, entry))
    out = []
    for seq, waiting in by_seq.items():
        behind = []
        for d in dumps:
            group = d.group(DEFAULT_PG)
            view = snap.rank(d.rank)
            if group is None or view is None or last_scheduled(d, DEFAULT_PG) >= seq:
                continue
            if not view.state.finished and current(d, snap):
                behind.append(view)
        if not behind:
            continue  # every backend scheduled it: a transport stall, not a wait for a rank
        first = min(entry.created_t or snap.taken_t for _, entry in waiting)
        entry = next(e for _, e in waiting if e.created_t == first)
        collective = CollectiveView(
            op=entry.op,
            seq=seq,
            waiting_s=max(0.0, snap.taken_t - first),
            shapes=entry.input_sizes,
            dtypes=tuple(dtype_name(t) for t in entry.input_dtypes),
            since_t=first,
        )
        waiters = tuple(sorted((v for v, _ in waiting), key=lambda v: v.rank))
        out.append(FrWait(waiters=waiters, behind=tuple(behind), collective=collective))
    out.sort(key=lambda w: -w.collective.waiting_s)
    return out


def still_waiting(dump: FrRank, view: RankView) -> bool:
    """The rank has trained no further since its dump: what the dump shows pending still is."""
    if dump.step is not None and view.step is not None:
        return view.step <= dump.step
    last = view.last_progress_t
    return last is None or last <= dump.taken_t + STALE_SLACK_S
