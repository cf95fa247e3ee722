"""No verdict before every node has spoken for the same time: a multi-node judgment waits until
the other nodes' summaries cover the moment it was first reached.

A watcher reads its own node's ranks from their files as they are written, and another node's
ranks from that node's summary, which is up to a second and a half old (published every second,
read at the next poll). Judged together, the two are views of different moments: at the end of
a healthy job, this node's ranks have finished 150 steps while the other node's summary still
shows 145, which reads as an uneven input (a MISMATCH); a crash of this node's rank that is the
consequence of another node's failure reads as its own until that node's summary says more.
Such a verdict is gone a second later, but a stop, a printed status line, diagnosis.json and a
TUI frame may all have shown it.

So while a job over several nodes runs, a problem verdict reached at time T is held back (shown
as RUNNING, without the findings that would name it) until every other node whose launcher still
runs has published a summary composed after T: its summaries' sequence number went up by two
since T (the first may have been written just before T and read just after; the second was
written after it, so after T). The node's clock is never trusted for the summaries' order (its
summary's `t` is the node's claim), only the order of its own summaries as this watcher saw them
change. (The ranks' heartbeat ages below are reckoned from each rank's own `t`, as the lost-host
rule reckons them: a skew of a second or more between the hosts can still let a survivor's
crash out before the lost host is named, as it could before.)

The wait is bounded: a node that publishes nothing new for LOST_AFTER_S, and whose ranks' own
heartbeats are that old too, is silent, and what silence means is node_ends' to say (a lost
host: its `silent_with_their_ranks` gives the silences, so that the survivor's crash is never
let out in the second where the node's summaries have gone quiet but its rank's last heartbeat,
read from the rank's file, is younger); after LOST_AFTER_S + 1 s the verdict is told whatever
the other nodes said. Both are counted as node_ends counts a silence (by the clock and
in the watcher's own polls), so that a verdict about a survivor is never let out before the
silence that would name the lost host is long enough to. A healthy node publishes every second, so a real problem is told
about two seconds later than on one node; the final verdict, read after every launcher ended,
is never held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.protocol.node_records import NodeRecord

# Summaries a node must publish after the verdict was reached (see the module's docstring).
SUMMARIES_AFTER = 2


@dataclass(frozen=True)
class NodeMark:
    """Where one node's summaries stood when the verdict was reached."""

    pid: int | None
    seq: int | None


@dataclass
class Coverage:
    """The problem verdict being held back, and the other nodes' summaries when it was reached."""

    key: tuple[Verdict, frozenset[int]] | None = None
    since: float = 0.0
    since_polls: int = 0
    marks: dict[int, NodeMark] = field(default_factory=dict)

    def hold(
        self,
        snap: Snapshot,
        nodes: Mapping[int, NodeRecord],
        seen: Mapping[int, object],
        silent_s: Mapping[int, float],
        *,
        own_node: int | None,
        now: float,
        polls: int,
        poll_s: float,
        wait_s: float,
    ) -> Snapshot:
        """`snap` as it may be shown now: its problem verdict, or RUNNING while another node's
        summaries do not cover the time it was reached (at most `wait_s` after it was, counted
        as node_ends counts a silence: by the clock and in this watcher's own polls of
        `poll_s`). `seen`: the summary feed's node -> what it last saw (seq, pid);
        `silent_s`: node -> its silence as node_ends takes it (a node silent LOST_AFTER_S is
        node_ends' to tell)."""
        if not snap.verdict.is_problem:
            self.key = None
            return snap
        key = (snap.verdict, snap.culprits)
        if key != self.key:  # a new verdict (or new culprits): its own wait, from now
            self.key, self.since, self.since_polls = key, now, polls
            self.marks = {
                node: NodeMark(getattr(s, "pid", None), getattr(s, "seq", None))
                for node, s in seen.items()
                if node != own_node and getattr(s, "seq", None) is not None
            }
        if min(now - self.since, (polls - self.since_polls) * poll_s) >= wait_s:
            return snap
        behind = [
            node
            for node, mark in self.marks.items()
            if _running(nodes.get(node))
            and silent_s.get(node, 0.0) < wait_s - 1.0
            and not _covered(mark, seen.get(node))
        ]
        if not behind:
            return snap
        # (what would name the problem waits with it; notes and warnings stay)
        return not_told_yet(
            snap, tuple(f for f in snap.findings if f.severity is not Severity.ERROR)
        )


def not_told_yet(snap: Snapshot, findings: tuple[Finding, ...]) -> Snapshot:
    """`snap` with its problem held back: RUNNING, no culprit, nothing to stop on."""
    return replace(
        snap,
        verdict=Verdict.RUNNING,
        culprits=frozenset(),
        confirmed=False,
        detected_after_s=None,
        findings=findings,
    )


def _running(record: NodeRecord | None) -> bool:
    """A node whose launcher still runs and publishes (an ended one's files are read here)."""
    return record is not None and not record.ended and record.stopped_for is None


def _covered(mark: NodeMark, seen: object) -> bool:
    if seen is None:
        return True
    pid, seq = getattr(seen, "pid", None), getattr(seen, "seq", None)
    if pid != mark.pid:
        return True  # a launcher started again: its summaries are new altogether
    if not isinstance(seq, int) or not isinstance(mark.seq, int):
        return True
    return seq >= mark.seq + SUMMARIES_AFTER
