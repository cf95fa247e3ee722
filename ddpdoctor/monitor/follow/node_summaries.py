"""Node summaries: what watchers take from the other nodes' launchers.

A job that spans nodes has one launcher per node. Each reads its own ranks' event files and
publishes a NodeSummary (ddpdoctor/protocol/node_summary.py) once a second
(ddpdoctor.monitor.follow.node_publisher). Every other watcher, node 0's launcher and `ddpdoctor watch`
included, reads those summaries instead of the ranks' files (`SummaryFeed`): one file per node
per second on the shared file system. A routine rank comes as a row, copied onto its record
(ddpdoctor.monitor.follow.rank_rows); another rank as its events new since the previous summary, which
a watcher that keeps up applies alone, while one that is behind on a rank takes the rank's whole
digest from the second line (`NodeMerge.apply_summary`).

A summary stands in for the rank files only while its node's launcher runs and keeps publishing:
once the launcher has ended, or its summaries stop coming (a node whose launcher died or hangs),
the watcher reads that node's rank files itself again, from their start, so the diagnosis then
rests on every event the ranks wrote. The summaries that stopped coming are a finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.event_claims import EventClaims
from ddpdoctor.monitor.follow.gone_claims import GoneClaims
from ddpdoctor.monitor.follow.liveness import is_local
from ddpdoctor.monitor.follow.node_publisher import Publisher
from ddpdoctor.monitor.follow.row_claims import RowClaims, write_order
from ddpdoctor.monitor.follow.row_reader import CallRecords, NodeRows, apply_rows
from ddpdoctor.monitor.model.launchers import proc_children
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.node_summary import (
    NodeSummary,
    RankEvents,
    read_node_summary,
    summary_stamp,
    valid_event,
)
from ddpdoctor.protocol.rundir import RunDir

# A summary unchanged this long (the watcher's own clock) no longer stands for its ranks: their
# files are read again. Several periods: a launcher busy for a moment (a py-spy capture) is not gone.
STALE_AFTER_S = 5.0
# ... and this long, it is a finding: the node's launcher stopped reporting.
STALE_FINDING_S = 10.0
# A watcher takes in at most this many nodes' summaries a second: at more nodes it reads each
# one every 2 s instead of every second (half of them each second), so node 0 of 1024 nodes x 8
# ranks stays under a quarter of a core (benchmarks/merge_scale.py), for a second more before it
# sees what another node's ranks did. Its own ranks it reads as ever.
SUMMARIES_PER_S = 512
SLOW_READ_EVERY_S = 2.0
# (a watcher polls every 0.5 s: a summary due "2 s later" is read at the fourth poll, not the fifth)
POLL_SLACK_S = 0.25


@dataclass
class _Seen:
    stamp: tuple[int, int, int] | None = None
    seq: int | None = None
    pid: int | None = None  # its writer (a launcher started again counts its summaries anew)
    changed_t: float | None = None  # when this watcher last saw it change (its own clock)
    ranks: tuple[int, ...] = ()
    said: Any = None  # what the summary said (rows, calls, events, gone), to tell a rewrite


class SummaryFeed:
    """Other nodes' summaries, read when they change (one stat per node per poll; at more than
    SUMMARIES_PER_S nodes, one per node every SLOW_READ_EVERY_S)."""

    def __init__(self, run: RunDir, own_node: int | None) -> None:
        self.run = run
        self.own_node = own_node
        self.seen: dict[int, _Seen] = {}
        self.due: dict[int, float] = {}  # node -> when to look at its summary again
        # node -> how two of its writes disagreed: one write number twice, or going back (a
        # launcher numbers its summaries one after another: row_claims)
        self.disputes: dict[int, str] = {}

    def poll(self, now: float, nodes: Mapping[int, NodeRecord]) -> list[tuple[int, NodeSummary]]:
        """The (node, summary) of every summary that changed since the last poll."""
        changed: list[tuple[int, NodeSummary]] = []
        slow = len(nodes) > SUMMARIES_PER_S
        due = self.due
        for node, record in nodes.items():
            if node == self.own_node or record.ended:
                continue
            if slow and now < due.get(node, now):
                continue
            stamp = summary_stamp(self.run, node)
            seen = self.seen.setdefault(node, _Seen())
            if stamp is None or stamp == seen.stamp:
                continue
            seen.stamp = stamp
            summary = read_node_summary(self.run, node)
            if summary is None:
                continue
            said = (summary.rows, summary.calls, summary.ranks, summary.gone)
            disputed = write_order(summary, said, seen.seq, seen.pid, seen.said)
            if disputed is not None:
                self.disputes.setdefault(node, disputed)
            if said == seen.said and (summary.seq, summary.pid) == (seen.seq, seen.pid):
                continue  # the same write again (its file touched, or read twice)
            seen.said = said  # (one number twice: both are read, and weighed: row_claims)
            if seen.seq is None and now >= summary.t:
                # First sight (a watcher started late): as old as its writer says, up to the
                # point where its files are read instead; its launcher is named only once this
                # watcher has itself seen no new one for a while.
                seen.changed_t = now - min(now - summary.t, STALE_AFTER_S)
            else:
                seen.changed_t = now
            seen.seq, seen.pid = summary.seq, summary.pid
            seen.ranks = summary.all_ranks()
            changed.append((node, summary))
            if slow:
                # half the nodes one second, the other half the next (the first time, by node
                # number), not all of them in one poll every other second
                wait = SLOW_READ_EVERY_S if node in due else (1 + node % 2) / 2 * SLOW_READ_EVERY_S
                due[node] = now + wait - POLL_SLACK_S
        return changed

    def standing(self, now: float, nodes: Mapping[int, NodeRecord]) -> set[int]:
        """The nodes whose summaries stand for their ranks now: launcher running, fresh summary."""
        return {
            node
            for node, seen in self.seen.items()
            if seen.changed_t is not None
            and node in nodes
            and not nodes[node].ended
            and 0 <= now - seen.changed_t < STALE_AFTER_S
        }

    def stale_findings(self, now: float, nodes: Mapping[int, NodeRecord]) -> list[Finding]:
        """A node whose launcher published summaries, has not ended, and stopped publishing."""
        found = []
        for node, seen in sorted(self.seen.items()):
            record = nodes.get(node)
            if record is None or record.ended or seen.changed_t is None:
                continue
            age = now - seen.changed_t
            if age < STALE_FINDING_S:
                continue
            found.append(
                Finding(
                    "node.stale",
                    Severity.WARNING,
                    f"node {node}'s launcher ({record.host}, pid {record.launcher_pid}) stopped "
                    f"reporting {age:.0f} s ago: its ranks are read from their own files "
                    "instead",
                    f"See whether `ddpdoctor run` on node {node} still runs (ps -p "
                    f"{record.launcher_pid} on {record.host}) and what it printed; its job goes "
                    "on, watched from the run directory.",
                    ranks=seen.ranks,
                )
            )
        return found


class NodeMerge:
    """Which ranks a watcher follows through their node's summary, and the merging itself.

    `state` is the watcher's RunState, `tailer` its RunTailer, `own_node` the launcher's node
    (None for `watch`). Node 0's launcher and `watch` merge every node's summary, all the time:
    a rank of another node goes over to its node's summary as soon as its hello names that node
    (or the summary names the rank) and the summary stands, and its event file is paused. When
    the summary stops standing (its launcher ended, or went quiet), the rank's record is started
    again from its own file.

    A launcher of node 1 and up reads its own ranks only (`held`: the others' files, paused),
    and pulls the other nodes' summaries on demand: from the moment one of its ranks waits or
    fails (`observe`), and at its end, or all along when someone looks at its view
    (`follow_all`). Node 0 leads: it stops the job, and the others follow its
    node record; so no node's launcher reads every other node's summary every second."""

    def __init__(
        self,
        run: RunDir,
        state: Any,
        tailer: Any,
        own_node: int | None,
        *,
        follow_all: bool = False,
    ) -> None:
        self.state = state
        self.tailer = tailer
        self.own_node = own_node
        self.feed = SummaryFeed(run, own_node)
        self.applied: dict[int, int] = {}  # rank -> the last line of its file applied
        self.via: dict[int, int] = {}  # rank -> the node whose summary stands for it
        self.rowed: set[int] = set()  # ranks whose record the latest row of its node made
        self.calls: dict[int, CallRecords] = {}  # node -> the call records of its last rows
        self._standing: set[int] = set()  # the nodes whose summaries stood at the last merge
        self._full: dict[int, list] | None = None  # the summary being applied: its digests
        self.held: set[int] = set()  # other nodes' ranks a follower does not follow (yet)
        self.publisher = Publisher(run, own_node) if own_node is not None else None
        self.gone = GoneClaims()
        self.claims = RowClaims()  # the calls other nodes' rows name, borne out or disputed
        self.events = EventClaims(self.claims)  # ... and the call starts their events carry
        self._now = 0.0  # (the merge's time: when the summaries it applies were read)
        self.follower = own_node is not None and own_node > 0
        # Whether other nodes' summaries are read. A follower whose view a person looks at (its
        # TUI, its live terminal view) reads them from the start, as node 0 does: otherwise the
        # other nodes' ranks would show there as never heard of. One such follower adds one stat
        # per node per second; followers nobody looks at (srun's, mostly) still add nothing.
        self.active = not self.follower or follow_all
        self.own_pids: dict[int, int] = {}  # a follower's own ranks (from its torchrun's children)

    def note(self, rank: int, line_no: int, event: dict[str, Any]) -> None:
        """An event read from a rank's own file."""
        if line_no > self.applied.get(rank, 0):
            self.applied[rank] = line_no
        if self.publisher is not None:
            self.publisher.note(rank, line_no, event)

    def observe(self, waiting_or_failed: bool) -> None:
        """A follower's own ranks wait in a collective or failed: time to see the others."""
        if waiting_or_failed:
            self.active = True

    def merge(self, now: float, nodes: Mapping[int, NodeRecord], *, final: bool) -> None:
        if final:
            self.active = True
        if not self.active:
            self._hold_others(nodes)
            return
        self._now = now
        changed = self.feed.poll(now, nodes) if nodes else []
        if self.feed.disputes:
            for node, why in self.feed.disputes.items():
                self.claims.dispute(node, why)
            self.feed.disputes.clear()
        standing = self.feed.standing(now, nodes) if self.feed.seen else set()
        if standing:
            # (the ranks not followed yet: this runs every poll, over 1000s of followed ones)
            ranks = self.state.ranks
            for rank in ranks.keys() - self.via.keys():
                if ranks[rank].host is None:
                    continue
                node = self.state.node_of(rank)
                if node is not None and node != self.own_node and node in standing:
                    self._follow(rank, node)
        for node, summary in changed:
            self.apply_summary(node, summary, standing)
        if self.gone.pending:
            self.gone.settle(self.state, now)
        if not standing >= self._standing:  # a node's summary stopped standing since
            for rank, node in list(self.via.items()):
                if node not in standing:
                    self._from_file(rank)
        self._standing = standing
        for rank in list(self.held):
            self._from_file(rank)  # no summary stands for it: its file, then
        if final:
            # The final word rests on every event: node 0's launcher and a watcher read the
            # files of the ranks followed through summaries once; a follower those of the
            # ranks whose end its summaries have not shown yet.
            for rank in list(self.via):
                tracker = self.state.ranks.get(rank)
                if not self.follower or tracker is None or tracker.exit_code is None:
                    self._from_file(rank)
            if self.gone.pending:
                self.gone.settle(self.state, now, final=True)

    def apply_summary(self, node: int, summary: NodeSummary, standing: set[int]) -> None:
        """Apply what is new to this watcher in a node's summary: its routine ranks' rows,
        and the others' events after the line it has applied. The head has what the previous
        summary did not; a rank this watcher is behind on (it missed a summary, or just began
        to follow the rank, or its node stopped sending its row) takes them from the whole
        digest, the summary's second line, parsed only then. A row is copied onto a rank whose
        record has its events up to its current process's hello (rank_rows)."""
        self._full = None
        self.events.read(node, self._now)
        for entry in summary.ranks:
            rank = entry.rank
            if not self._takes(rank, node, standing, entry.last):
                continue
            have = self.applied.get(rank, 0)
            if rank in self.rowed:  # its events again: from its whole digest, afresh
                have = self._unrow(rank)
            if have < entry.after:
                self._from_digest(node, rank, summary, have, entry.last)
            else:
                applied = self._apply_events(node, rank, entry.events, have)
                self.applied[rank] = max(applied, entry.last)
        if summary.rows is not None:
            self._apply_rows(node, summary, standing)
        # the call starts earlier summaries carried, weighed against this one (event_claims)
        full = [RankEvents(r, e) for r, e in self._full.items()] if self._full else None
        self.events.bear(node, summary.ranks, full)
        self.events.mark(node, self.via, self.rowed, self.state.ranks)
        self._full = None
        # its node saw the process end: checked before it ends the rank (gone_claims)
        self.gone.claim(node, summary, self.state, is_local, lambda r: self.via.get(r) == node)

    def _takes(self, rank: int, node: int, standing: set[int], last: int) -> bool:
        """Whether this watcher follows `rank` through node's summary, and is behind `last`."""
        if rank not in self.via and node in standing:
            known = self.state.node_of(rank)
            if known in (None, node):  # not read from its file yet, or read as node's
                self._follow(rank, node)
        return self.via.get(rank) == node and self.applied.get(rank, 0) < last

    def _apply_rows(self, node: int, summary: NodeSummary, standing: set[int]) -> None:
        rows = NodeRows(summary.rows)
        targets, behind = [], []
        ranks = self.state.ranks
        for i, rank in enumerate(rows.ranks):
            if not self._takes(rank, node, standing, rows.last[i]):
                continue
            tracker = ranks.get(rank)
            pid = rows.value("pid", i)
            if tracker is not None and type(pid) is int and tracker.pid == pid:
                targets.append((i, tracker))
                continue
            behind.append(i)  # not heard of yet, or a new process: its events first
        records = CallRecords(summary.calls, self.calls.get(node))
        self.calls[node] = records
        if targets:
            steps = {tracker.rank: tracker.step for _, tracker in targets}
            applied = apply_rows(targets, rows, records)
            for tracker in applied:
                rank = tracker.rank
                self.state.row_applied(tracker, stepped=tracker.step != steps[rank])
                self.rowed.add(rank)
            done = {tracker.rank for tracker in applied}
            for i, tracker in targets:
                if tracker.rank in done:
                    self.applied[tracker.rank] = rows.last[i]
                else:
                    behind.append(i)
            if applied:
                self.state.add_waits(summary.waits)
        # the calls no later write of the node bore out: not compared yet (row_claims)
        rowed = [ranks[r] for r in rows.ranks if r in self.rowed and self.via.get(r) == node]
        for tracker in self.claims.bear(node, rows, records, rowed, self._now):
            self.state.row_applied(tracker, stepped=False)
        for i in behind:
            rank = rows.ranks[i]
            have = self._unrow(rank) if rank in self.rowed else self.applied.get(rank, 0)
            self._from_digest(node, rank, summary, have, rows.last[i])

    def _unrow(self, rank: int) -> int:
        """A rank whose record rows made: a fresh record, for its events (returns 0, the line
        applied)."""
        self.rowed.discard(rank)
        self.state.restart_rank(rank)
        self.applied[rank] = 0
        return 0

    def _from_digest(
        self, node: int, rank: int, summary: NodeSummary, have: int, last: int
    ) -> None:
        """Apply the rank's events after line `have` from the summary's whole digest."""
        if self._full is None:
            self._full = {r.rank: r.events for r in summary.full() or ()}
        if rank not in self._full:
            return  # the second line torn or missing: the next summary has it
        applied = self._apply_events(node, rank, self._full[rank], have)
        self.applied[rank] = max(applied, last)

    def _apply_events(self, node: int, rank: int, events: list, last: int) -> int:
        """Apply, in order, the rank's summary events after line `last`; the last line applied."""
        rel = f"events/rank-{rank}.jsonl"
        for pair in events:
            if type(pair) is list and len(pair) == 2 and type(pair[0]) is int:
                if pair[0] <= last:
                    continue  # applied already
                valid = valid_event(pair, rank)
                if valid is not None:
                    self.state.apply(valid[1], (rel, valid[0]))
                    self.events.claim(node, rank, valid[0], valid[1])
                    last = valid[0]
        return last

    def _follow(self, rank: int, node: int) -> None:
        self.via[rank] = node
        self.held.discard(rank)
        self.tailer.pause(rank)
        self._forget_digest(rank)

    def _forget_digest(self, rank: int) -> None:
        if self.publisher is not None:
            self.publisher.forget(rank)  # another node's: never this one's to publish

    def _hold_others(self, nodes: Mapping[int, NodeRecord]) -> None:
        """A follower not (yet) merging: pause every other node's rank file it has found."""
        record = nodes.get(self.own_node) if self.own_node is not None else None
        if record is not None and record.torchrun_pid and len(self.own_pids) < (record.nproc or 1):
            self.own_pids = ranks_of_children(record.torchrun_pid)
        complete = record is not None and len(self.own_pids) >= (record.nproc or 1)
        for rank in self.tailer.event_ranks():
            if rank in self.held or rank in self.via or rank in self.own_pids:
                continue
            node = self.state.node_of(rank) if rank in self.state.ranks else None
            if node is None and not complete:
                continue  # not known yet: its hello will tell
            if node != self.own_node:
                # What its file said so far would age into a false "stalled": it is unknown
                # here until pulled (its node's summary, or its file once more).
                self.held.add(rank)
                self.tailer.pause(rank)
                self._forget_digest(rank)
                self.applied[rank] = 0
                self.state.restart_rank(rank)

    def _from_file(self, rank: int) -> None:
        """Read the rank's own file again, from its start, into a fresh record."""
        self.via.pop(rank, None)
        self.events.forget(rank)
        self.rowed.discard(rank)
        self.held.discard(rank)
        self.applied[rank] = 0
        self.state.restart_rank(rank)
        self.tailer.resume(rank)

    def publish(self, now: float, *, force: bool = False) -> None:
        if self.publisher is None:
            return
        own = [r for r in self.publisher.digests if self.state.node_of(r) == self.own_node]
        self.publisher.maybe_publish(now, own, force=force, trackers=self.state.ranks)

    def findings(self, now: float, nodes: Mapping[int, NodeRecord]) -> list[Finding]:
        return (
            (self.feed.stale_findings(now, nodes) if self.feed.seen else [])
            + self.gone.findings()
            + self.claims.findings(self.via)
        )


def ranks_of_children(pid: int) -> dict[int, int]:
    """rank -> pid of a local torchrun's workers, from their environment (RANK): which event
    files are this node's before any of them is read. {} where /proc does not tell."""
    found: dict[int, int] = {}
    for child, _argv in proc_children(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as fh:
                env = fh.read(1 << 20)
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(b"RANK="):
                try:
                    found[int(item[5:])] = child
                except ValueError:
                    pass
                break
    return found
