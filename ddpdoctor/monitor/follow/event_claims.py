"""Another node's events as claims: a call start a node's summary carries (a rank that is not
routine comes as its events, with their line numbers) is compared only once a later write of
the node carries the same event at the same line.

The per-rank numbering check (ddpdoctor.monitor.model.call_events) catches a forged call whose
number the rank's own next call repeats. Through a summary it is not enough: a rewritten
summary sets the line numbers too, and a forged call given the lines the rank's own next events
will have, with its end line, is read as borne out, while the rank's own events at those lines
are then skipped as read already. So, as for rows (ddpdoctor.monitor.follow.row_claims):

- a `collective_start` read from a summary is left out of the comparison (RankTracker.claimed)
  until a write of its node read BEAR_AFTER_S or more later carries the same event at the same
  line, or says it carried that line before (its head's `after`: the launcher publishes a line
  once, in its head; its second line, every rank's digest, is not parsed for this);
- a later write with another event at that line disputes the node (row_claims).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from ddpdoctor.monitor.follow.row_claims import BEAR_AFTER_S, RowClaims
from ddpdoctor.monitor.model.event_fields import p2p_group, text
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS
from ddpdoctor.protocol import events as ev

MAX_PENDING = 4096  # call starts not borne out yet, kept per node
DISPUTED = -1  # (in place of the write that carried a call start two writes disagreed on)

Line = tuple[int, int]  # (rank, line number in its file)


def call_key(event: dict[str, Any]) -> tuple[str, Any]:
    """(group, number) of a collective_start, as its rank's record keys it (call_events)."""
    op = text(event.get("op")) or "collective"
    group = text(event.get("group")) or ev.DEFAULT_GROUP
    if event.get("p2p") or op in POINT_TO_POINT_OPS:
        group = p2p_group(group, event.get("peer"))
    return group, event.get("seq")


class EventClaims:
    """The call starts other nodes' summaries carried and no later write bore out yet."""

    def __init__(self, claims: RowClaims) -> None:
        self.claims = claims  # (where a node's writes that disagree are noted)
        # node -> (rank, line) -> (the event, the write that carried it, when it was read)
        self.pending: dict[int, dict[Line, tuple[dict[str, Any], int, float]]] = {}
        self.writes: dict[int, int] = {}  # node -> its summaries read (each another write)
        self.marked: dict[int, set[int]] = {}  # node -> its ranks whose records say claims
        self.now = 0.0

    def read(self, node: int, now: float) -> None:
        """Another write of node's summary, read at `now`."""
        self.writes[node] = self.writes.get(node, 0) + 1
        self.now = now

    def claim(self, node: int, rank: int, line: int, event: dict[str, Any]) -> None:
        """An event of node's summary applied to rank's record."""
        if event.get("kind") != ev.COLLECTIVE_START:
            return
        pending = self.pending.setdefault(node, {})
        if len(pending) >= MAX_PENDING:
            del pending[next(iter(pending))]
        pending[(rank, line)] = (event, self.writes.get(node, 0), self.now)

    def bear(self, node: int, heads: Any, full: Any = None) -> None:
        """Weigh node's pending call starts against this write: the events its head carries
        (`heads`, its RankEvents), and the lines its head says an earlier write of it carried
        already (`after`: the launcher publishes each line once, in its head, then keeps it in
        its digests only); and its digests (`full`) where this watcher read them anyway."""
        pending = self.pending.get(node)
        if not pending:
            return
        self._weigh(node, pending, heads, published=True)
        if full:
            self._weigh(node, pending, full, published=False)

    def _weigh(self, node: int, pending: dict, entries: Any, *, published: bool) -> None:
        write = self.writes.get(node, 0)
        ranks = {rank for rank, _ in pending}
        for entry in entries:
            if entry.rank not in ranks or not isinstance(entry.events, list):
                continue
            for pair in entry.events:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not int:
                    continue
                key = (entry.rank, pair[0])
                claim = pending.get(key)
                if claim is None or claim[1] == DISPUTED:
                    continue
                event, first, t = claim
                if pair[1] != event:
                    self.claims.dispute(
                        node,
                        f"rank {entry.rank}'s line {pair[0]}: {_said(event)} in one write, "
                        f"{_said(pair[1])} in another",
                    )
                    pending[key] = (event, DISPUTED, t)  # never compared
                elif first != write and self.now - t >= BEAR_AFTER_S:
                    del pending[key]
            if published and type(entry.after) is int:
                for key in [k for k in pending if k[0] == entry.rank and k[1] <= entry.after]:
                    _, first, t = pending[key]
                    if first not in (write, DISPUTED) and self.now - t >= BEAR_AFTER_S:
                        del pending[key]

    def mark(
        self, node: int, via: Mapping[int, int], rowed: Container[int], trackers: Mapping
    ) -> None:
        """Tell the records of node's ranks followed through their events (`via`: rank -> its
        node, `rowed`: those its rows make) which of their calls are not borne out
        (RankTracker.claimed: a live view leaves them out of the comparison)."""
        pending = self.pending.get(node) or {}
        marked = self.marked.get(node, set())
        disputed = node in self.claims.disputed
        if not pending and not marked and not disputed:
            return  # (the usual case: every rank of the node a row; this runs per summary)
        now_marked = set()
        ranks = {r for r, n in via.items() if n == node} if disputed else set()
        for rank in {rank for rank, _ in pending} | marked | ranks:
            tracker = trackers.get(rank)
            if via.get(rank) != node or rank in rowed or tracker is None:
                continue
            claimed = self.unborne(node, rank)
            if disputed:  # a disputed node's calls are compared no more (row_claims)
                calls = (*tracker.latest_calls(), *tracker.opens.values())
                claimed |= {(c.group, c.seq) for c in calls}
            if claimed:
                now_marked.add(rank)
            if tracker.claimed != claimed:
                tracker.claimed = claimed
                tracker.version += 1
        self.marked[node] = now_marked

    def unborne(self, node: int, rank: int) -> set[tuple[str, Any]]:
        """The keys of rank's call starts from node's summaries not borne out yet."""
        pending = self.pending.get(node)
        if not pending:
            return set()
        return {call_key(event) for (r, _), (event, _, _) in pending.items() if r == rank}

    def forget(self, rank: int) -> None:
        """Rank's record is read from its own file again: its summary's claims are moot."""
        for pending in self.pending.values():
            for key in [k for k in pending if k[0] == rank]:
                del pending[key]


def _said(event: Any) -> str:
    if not isinstance(event, dict):
        return "something else"
    kind = text(event.get("kind")) or "an event"
    op, seq = text(event.get("op")), event.get("seq")
    return f"{kind} {op} #{seq}" if op else kind
