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
    start_seqs: dict[str, int]  # the last number a collective_start line gave, per group
    denials: dict[tuple[str, int], int]  # heartbeats that said "in no call" after its start
    unborne: set[tuple[str, int]]  # calls whose start nothing of the process bore out yet
    reports_calls: bool  # its heartbeats say which call it is in (`open`)
    disputed: str | None
    disputed_calls: int
    sends_p2p: bool  # it made a point-to-point call


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
    if "open" in e:
        tracker.reports_calls = True
    if opened is None and "open" in e:
        tracker.opens.clear()  # the rank is in no collective right now
        deny_unended(tracker)
        if tracker.unborne:
            unended = {(c.group, c.seq) for c in tracker.recent if not c.done}
            tracker.unborne &= unended
    elif isinstance(opened, dict):
        seq = integer(opened.get("seq"))
        op = text(opened.get("op"))
        if seq is not None and op is not None:
            group = text(opened.get("group")) or ev.DEFAULT_GROUP
            p2p = bool(opened.get("p2p")) or op in POINT_TO_POINT_OPS
            if p2p:
                group = p2p_group(group, opened.get("peer"))
            key = (group, seq)
            tracker.unborne.discard(key)  # its runtime says it is in that call
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


# Heartbeats saying the rank is in no call that make a call it never ended not its own: the
# first may have been made just before the call began and written just after its start line.
DENIALS = 2


def deny_unended(tracker: CallRecord) -> None:
    """A heartbeat says the rank is in no collective: a call of its latest whose start was read
    but whose end was not, at DENIALS such heartbeats, is a line its runtime never wrote (it
    records a call's end before it stops reporting the call open)."""
    unended = {(c.group, c.seq) for c in tracker.recent if not c.done}
    denials = {key: n for key, n in tracker.denials.items() if key in unended}
    for key in unended:
        denials[key] = denials.get(key, 0) + 1
    tracker.denials = denials
    for (group, seq), n in list(denials.items()):
        if n >= DENIALS:
            call = next(c for c in tracker.recent if (c.group, c.seq) == (group, seq))
            drop_calls(tracker, group, seq, only=True)
            del denials[(group, seq)]
            note_dispute(
                tracker, group, f"{call.describe()}, which its heartbeats say it never entered"
            )


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
        step=integer(e.get("step")),
    )
    if not p2p:
        last = tracker.start_seqs.get(group)
        tracker.start_seqs[group] = seq
        if last is not None and seq <= last:
            dispute(tracker, view, last)
            return
    tracker.opens[(view.group, seq)] = view
    if p2p:
        tracker.sends_p2p = True
    bear(tracker, view.group, seq)
    if not p2p:
        tracker.recent.append(view)
        note_seq(tracker, group, seq)
    tracker.last_event = f"collective_start {op} #{seq}"


def bear(tracker: CallRecord, group: str, seq: int) -> None:
    """A call's start line is read: it is unborne until its process bears it out, by the
    call's end line, a heartbeat that shows it open, or a later call of the group (a live
    rank's view and its node's rows leave it out until then: at most a heartbeat). A later
    start bears out the earlier ones of its group: the process numbered past them. (Only for
    a process whose heartbeats report its calls: no other can bear a call out but by its end.)"""
    unborne = tracker.unborne
    if unborne:
        for key in [k for k in unborne if k[0] == group and k[1] < seq]:
            unborne.discard(key)
    if tracker.reports_calls:
        unborne.add((group, seq))


def dispute(tracker: CallRecord, view: CollectiveView, last: int) -> None:
    """A collective_start numbered at or below one read before from the same process. A rank's
    runtime numbers its calls of a group one after another, so one of the lines is not its own
    (appended by another process, or left from before): which one, the file cannot tell. Every
    call of the group numbered from this one on is dropped from the comparison, this one too,
    and the count goes on from it; the rank's heartbeats say which call it really is in."""
    group, seq = view.group, view.seq
    earlier = next((c for c in tracker.recent if (c.group, c.seq) == (group, seq)), None)
    drop_calls(tracker, group, seq, only=False)
    said = (
        f"two calls numbered #{seq}: {earlier.describe()} and {view.describe()}"
        if earlier is not None
        else f"{view.describe()} after #{last}"
    )
    note_dispute(tracker, group, said)


def drop_calls(tracker: CallRecord, group: str, seq: int, *, only: bool) -> None:
    """Forget the rank's calls of `group` numbered `seq` (`only`) or from `seq` on."""

    def dropped(c: CollectiveView) -> bool:
        return c.group == group and (c.seq == seq if only else c.seq >= seq)

    if any(dropped(c) for c in tracker.recent):
        kept = [c for c in tracker.recent if not dropped(c)]
        tracker.recent = deque(kept, maxlen=tracker.recent.maxlen)
    for key in [
        k for k in tracker.opens if k[0] == group and (k[1] == seq or (not only and k[1] > seq))
    ]:
        del tracker.opens[key]
    for key in [
        k for k in tracker.unborne if k[0] == group and (k[1] == seq or (not only and k[1] > seq))
    ]:
        tracker.unborne.discard(key)


def note_dispute(tracker: CallRecord, group: str, said: str) -> None:
    tracker.disputed_calls += 1
    if tracker.disputed is None:
        where = f" of group {group}" if group != ev.DEFAULT_GROUP else ""
        tracker.disputed = f"calls{where} not of its own making ({said})"


def collective_end(tracker: CallRecord, e: dict[str, Any], t: float | None, where: Any) -> None:
    """A collective_end: the call is done (its duration kept), or failed (kept as the call the
    rank failed in)."""
    seq = integer(e.get("seq"))
    group = text(e.get("group")) or ev.DEFAULT_GROUP
    op = text(e.get("op")) or "collective"
    if e.get("p2p") or op in POINT_TO_POINT_OPS:
        group = p2p_group(group, e.get("peer"))
    opened = tracker.opens.pop((group, seq), None) if seq is not None else None
    tracker.unborne.discard((group, seq if seq is not None else -1))
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
            step=opened.step,
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
                step=view.step,
            )
            break
    tracker.last_event = f"collective_end {op} #{seq}"
    if e.get("ok") is False and text(e.get("error")) and tracker.error is None:
        tracker.error = text(e.get("error"))
