"""Another node's rows as claims: a call its summary names counts only once the node's own
later writes bear it out, and a node whose writes disagree decides no stop any more.

A node's summary (nodes/node-N/summary.json) is written by its launcher once a second, but any
process of the job can rewrite it, copying the launcher's host and pid: a summary rewritten once
with rank 1 "in broadcast #11 of [7, 3]", while rank 1 really was in all_reduce #11 of [4], made
a cross-node mismatch and stopped both nodes of a healthy job. So, for the calls a node's rows
name (their latest calls and the ones they are in, by group and number):

- a call is compared (can feed a mismatch, a stop) only once a later write of the same node
  carries the same call at the same number. The launcher republishes every second, so a real
  call, a stuck one above all, is borne out within a second; a one-off write is overwritten by
  the launcher's own, which carries the rank's real call at that number;
- two writes that disagree (the same group and number, another call; two different summaries
  with one write number; a write number going back) dispute the node: a warning
  (`node.summary_disputed`), and from then on its rows explain (the ranks' state, step and
  activity are still shown) but decide nothing: their calls are compared no more (which write
  was the launcher's, the file cannot tell), and a verdict whose culprits are its ranks is told,
  never stopped on (ddpdoctor.monitor.pipeline.seen.undisputed). The final verdict of a run
  reads every rank's own event file, no summary.

The cost: a rank of another node's latest call is compared a second later than before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.rank_rows import CallKey
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import CollectiveView
from ddpdoctor.rank_ranges import named_ranks

MAX_CALLS = 4096  # calls remembered per node (its ranks' latest 16, a few groups: far fewer)
# A later write bears a call out only once this long (the watcher's own clock) after the call
# was first read: the launcher writes once a second, and a process rewriting its file faster
# must keep its claim up that long, through the launcher's own writes.
BEAR_AFTER_S = 0.9


class _Claim:
    """One call a node's summaries named, as first read."""

    __slots__ = ("borne", "t", "what", "write")

    def __init__(self, what: Any, write: int, t: float) -> None:
        self.what = what  # (signature, members); None once two writes disagreed on it
        self.write = write  # the write that first named it
        self.t = t  # when that write was read (the watcher's clock)
        self.borne = False


class _Ledger:
    """The calls one node's summaries named for its rows, each as first read, and in which of
    its writes (counted by this watcher: each summary it applied is another write)."""

    __slots__ = ("calls", "pids", "writes")

    def __init__(self, pids: tuple[Any, ...]) -> None:
        self.calls: dict[CallKey, _Claim] = {}
        self.pids = pids  # its rows' processes: a restarted rank numbers its calls anew
        self.writes = 0


class RowClaims:
    """What the other nodes' summaries claimed of their ranks' calls, and the nodes disputed."""

    def __init__(self) -> None:
        self.ledgers: dict[int, _Ledger] = {}
        self.disputed: dict[int, str] = {}  # node -> what its writes disagreed on (the first)

    def dispute(self, node: int, why: str) -> None:
        self.disputed.setdefault(node, why)

    def weigh(
        self, node: int, calls: Iterable[CollectiveView], pids: tuple[Any, ...], now: float
    ) -> _Ledger:
        """The calls node's summary, another write of it read at `now`, names for its rows,
        weighed against its earlier writes: a call one of them named the same way, at least
        BEAR_AFTER_S before, is borne out; another call at a number named before, disputed."""
        ledger = self.ledgers.get(node)
        if ledger is None or ledger.pids != pids:
            ledger = self.ledgers[node] = _Ledger(pids)
        ledger.writes += 1
        write = ledger.writes
        known = ledger.calls
        for call in calls:
            key = (call.group, call.seq)
            what = (call.signature(), call.group_ranks)
            claim = known.get(key)
            if claim is None:
                if len(known) >= MAX_CALLS:
                    del known[next(iter(known))]
                known[key] = _Claim(what, write, now)
            elif claim.what is None:
                continue  # disagreed on before: compared no more
            elif claim.what != what:
                self._disagree(node, call, claim)
            elif not claim.borne and claim.write != write and now - claim.t >= BEAR_AFTER_S:
                claim.borne = True
        return ledger

    def _disagree(self, node: int, call: CollectiveView, claim: _Claim) -> None:
        self.dispute(node, f"{call.describe()} in one write, {_said(claim.what, call)} in another")
        claim.what = None  # which write was the launcher's, the file cannot tell
        claim.borne = False

    def bear(
        self, node: int, rows: Any, records: Any, rowed: list[RankTracker], now: float
    ) -> list[RankTracker]:
        """Another write of node's summary, read at `now`: its rows' calls weighed against its
        earlier writes, and the records its rows made (`rowed`) told which of their calls are
        not borne out (RankTracker.claimed: a live view leaves them out of the comparison, as
        a start line its process has not borne out yet). Returns the records changed."""
        pids = tuple(rows.value("pid", i) for i in range(len(rows.ranks)))
        known = self.weigh(node, named_calls(rows, records), pids, now).calls
        if node in self.disputed:
            known = {}  # (none borne out: a disputed node's calls are compared no more)
        changed = []
        shared: dict[int, set[CallKey]] = {}  # (the ranks of a node share their latest calls)
        for tracker in rowed:
            recent = tracker.latest_calls()
            unborne = shared.get(id(recent))
            if unborne is None:
                unborne = shared[id(recent)] = _unborne(recent, known)
            if tracker.opens:
                unborne = unborne | _unborne(tracker.opens.values(), known)
            if tracker.claimed != unborne:
                tracker.claimed = set(unborne)
                tracker.version += 1
                changed.append(tracker)
        return changed

    def findings(self, via: Mapping[int, int]) -> list[Finding]:
        """One warning per disputed node; `via`: rank -> the node whose summary stands for it."""
        found = []
        for node, why in sorted(self.disputed.items()):
            ranks = tuple(sorted(r for r, n in via.items() if n == node))
            whose = f" ({named_ranks(ranks)})" if ranks else ""
            found.append(
                Finding(
                    "node.summary_disputed",
                    Severity.WARNING,
                    f"node {node}'s summary{whose} is disputed: two of its writes disagree "
                    f"({why}); its ranks' calls are no longer compared, and nothing it says "
                    "stops the job",
                    "A node's summary is written by its own launcher once a second, each write "
                    "numbered. Another process of the job rewrote it: from then on its ranks are "
                    "shown as it says, but a mismatch or a culprit among them is never acted "
                    "on. The final verdict reads every rank's own event file.",
                    ranks=ranks,
                )
            )
        return found


def write_order(
    summary: Any, said: Any, seq: int | None, pid: int | None, before: Any
) -> str | None:
    """How a node's summary just read disagrees with the one read before it (`said`: what it
    says, `before`: what that one said, `seq` and `pid`: its number and writer), if it does:
    the launcher numbers its writes one after another, each once."""
    if summary.pid != pid or seq is None:
        return None  # (a launcher started again numbers its summaries anew)
    if summary.seq == seq and said != before:
        return f"two different writes numbered #{seq}"
    if summary.seq < seq:
        return f"write #{summary.seq} read after #{seq}"
    return None


def _unborne(calls: Iterable[CollectiveView], known: Mapping[CallKey, _Claim]) -> set[CallKey]:
    """The keys of `calls` no later write of their node bore out as they are."""
    found = set()
    for call in calls:
        key = (call.group, call.seq)
        claim = known.get(key)
        if claim is None or not claim.borne or claim.what != (call.signature(), call.group_ranks):
            found.add(key)
    return found


def _said(before: Any, call: CollectiveView) -> str:
    """How an earlier write named the call at `call`'s number (its op, shapes and dtypes)."""
    op, shapes, dtypes = before[0]
    other = CollectiveView(op, call.seq, 0.0, group=call.group, shapes=shapes, dtypes=dtypes)
    return other.describe()


def named_calls(rows: Any, records: Any) -> list[CollectiveView]:
    """The distinct calls a node's rows name (their latest calls and the ones they are in),
    from its call table (row_reader.CallRecords): each column read once where its ranks share
    it (rows.same), else once per rank."""
    indices: set[int] = set()
    for name in ("recent", "opens"):
        values = [rows.same[name]] if name in rows.same else rows.each.get(name) or []
        for value in values:
            if not isinstance(value, list):
                continue
            for item in value:
                i = item[0] if type(item) is list and item else item
                if type(i) is int:
                    indices.add(i)
    found = []
    for i in sorted(indices):
        call = records.get(i)
        if call is not None:
            found.append(call)
    return found
