"""How a rank's collectives fold into its record (RankTracker): the calls it opened and closed,
the one it waits in as its heartbeats say, the latest calls kept for the mismatch comparison,
and the sequence number it reached in each group. Point-to-point calls count per peer."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from ddpdoctor.monitor.model.event_fields import (
    call_site,
    integer,
    ints,
    num,
    p2p_group,
    shapes,
    strings,
    text,
)
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CollectiveView
from ddpdoctor.protocol import events as ev


class CallRecord(Protocol):
    """What this module keeps of a rank's record (ddpdoctor.monitor.model.rank_tracker)."""

    opens: dict[tuple[str, int], CollectiveView]  # the calls it is in, by (group, seq)
    # the latest sequence number it reached in each group: replaced, never changed in place
    # (rank views share the tuple made from one dict until another dict is given)
    group_seqs: dict[str, int]
    recent: deque[CollectiveView]  # its latest calls, oldest first
    collectives_done: int
    failed_collective: CollectiveView | None
    last_event: str | None
    error: str | None


MAX_PEERS = 16


def peers_of(e: dict[str, Any]) -> tuple[int, ...]:
    """The global ranks a point-to-point call waits on: its peer, else the peers of its batch
    (`p2p_ops` of a collective_start, `peers` of a heartbeat's open call)."""
    peer = integer(e.get("peer"))
    if peer is not None:
        return (peer,)
    found: set[int] = set()
    listed = e.get("peers")
    if isinstance(listed, list):
        found.update(p for p in listed[:MAX_PEERS] if integer(p) is not None)
    ops = e.get("p2p_ops")
    if isinstance(ops, list):
        for part in ops[:MAX_PEERS]:
            if isinstance(part, list) and len(part) == 3 and integer(part[1]) is not None:
                found.add(part[1])
    return tuple(sorted(found))


def note_seq(tracker: CallRecord, group: str, seq: int) -> None:
    """A new dict, never the old one changed: a rank's view is remade from the dict's identity
    (RankViews._items), and a dict changed in place left a rank that went on alone (its peer
    ended, its view no longer remade) at the number it had when the peer's view was last made."""
    if seq > tracker.group_seqs.get(group, 0):
        tracker.group_seqs = {**tracker.group_seqs, group: seq}


def open_from_heartbeat(tracker: CallRecord, e: dict[str, Any], t: float | None) -> None:
    """The call a heartbeat says the rank is in (`open`: null when in none), and how many calls
    it has finished: a rank blocked inside a call still beats."""
    opened = e.get("open")
    if opened is None and "open" in e:
        tracker.opens.clear()  # the rank is in no collective right now
    elif isinstance(opened, dict):
        seq = integer(opened.get("seq"))
        op = text(opened.get("op"))
        if seq is not None and op is not None:
            group = text(opened.get("group")) or ev.DEFAULT_GROUP
            p2p = bool(opened.get("p2p")) or op in POINT_TO_POINT_OPS
            if p2p:
                group = p2p_group(group, opened.get("peer"))
            key = (group, seq)
            if key not in tracker.opens:
                since = num(opened.get("since_t"))
                tracker.opens[key] = CollectiveView(
                    op,
                    seq,
                    0.0,
                    group=group,
                    since_t=since or t,
                    peers=peers_of(opened) if p2p else (),
                )
                if not p2p:
                    note_seq(tracker, group, seq)
    done = integer(e.get("collectives_done"))
    if done is not None and done > tracker.collectives_done:
        tracker.collectives_done = done


def collective_start(tracker: CallRecord, e: dict[str, Any], t: float | None, where: Any) -> None:
    """A collective_start: the call is open, and one of the rank's latest calls."""
    op = text(e.get("op")) or "collective"
    seq = integer(e.get("seq"))
    if seq is None:
        return
    group = text(e.get("group")) or ev.DEFAULT_GROUP
    p2p = bool(e.get("p2p")) or op in POINT_TO_POINT_OPS
    view = CollectiveView(
        op,
        seq,
        0.0,
        group=p2p_group(group, e.get("peer")) if p2p else group,
        shapes=shapes(e.get("shapes")),
        dtypes=strings(e.get("dtypes")),
        since_t=t,
        group_ranks=ints(e.get("group_ranks")),
        site=call_site(e.get("site")),
        peers=peers_of(e) if p2p else (),
    )
    tracker.opens[(view.group, seq)] = view
    if not p2p:
        tracker.recent.append(view)
        note_seq(tracker, group, seq)
    tracker.last_event = f"collective_start {op} #{seq}"


def collective_end(tracker: CallRecord, e: dict[str, Any], t: float | None, where: Any) -> None:
    """A collective_end: the call is done (its duration kept), or failed (kept as the call the
    rank failed in)."""
    seq = integer(e.get("seq"))
    group = text(e.get("group")) or ev.DEFAULT_GROUP
    op = text(e.get("op")) or "collective"
    if e.get("p2p") or op in POINT_TO_POINT_OPS:
        group = p2p_group(group, e.get("peer"))
    opened = tracker.opens.pop((group, seq), None) if seq is not None else None
    if e.get("ok") is False and opened is not None:
        # A collective that failed (its peer died, a timeout): keep it, so the rank still
        # shows what it was waiting in when it failed (a hang that ended in teardown).
        duration = num(e.get("duration_s"))
        if duration is None and t is not None and opened.since_t is not None:
            duration = t - opened.since_t
        tracker.failed_collective = CollectiveView(
            opened.op,
            opened.seq,
            duration or 0.0,
            group=opened.group,
            shapes=opened.shapes,
            dtypes=opened.dtypes,
            since_t=opened.since_t,
            group_ranks=opened.group_ranks,
            site=opened.site,
            peers=opened.peers,
        )
    tracker.collectives_done += 1
    duration = num(e.get("duration_s"))
    for i in range(len(tracker.recent) - 1, -1, -1):
        view = tracker.recent[i]
        if view.seq == seq and view.group == group:
            tracker.recent[i] = CollectiveView(
                view.op,
                view.seq,
                duration if duration is not None else view.waiting_s,
                group=view.group,
                shapes=view.shapes,
                dtypes=view.dtypes,
                since_t=view.since_t,
                group_ranks=view.group_ranks,
                done=True,
                site=view.site,
            )
            break
    tracker.last_event = f"collective_end {op} #{seq}"
    if e.get("ok") is False and text(e.get("error")) and tracker.error is None:
        tracker.error = text(e.get("error"))
