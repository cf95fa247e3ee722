"""The launchers' node records (RUN_DIR/nodes/node-<N>/node.json), as a watcher keeps up with them.

A job that spans nodes has one launcher per node, each with a record of its host, its pid, its
torchrun and how it ended. A watcher looks at them at most once a second, and a record's file is
read again only when it was replaced (ddpdoctor.protocol.node_records.NodeRecordReader): one
stat per node for node 0's launcher and `watch`, not one read and parse.
"""

from __future__ import annotations

from ddpdoctor.protocol.node_records import NodeRecord, NodeRecordReader
from ddpdoctor.protocol.rundir import RunDir

NODES_EVERY_S = 1.0  # how often the node records are looked at again
NODES_FULL_EVERY_S = 30.0  # ... all of them, by a quiet launcher of node 1 and up (see refresh)


class NodeWatch:
    def __init__(self, run: RunDir) -> None:
        self.reader = NodeRecordReader(run)
        self.nodes: dict[int, NodeRecord] = {}
        self._read_t: float | None = None
        self._full_t: float | None = None

    def due_now(self) -> None:
        """Read the records at the next refresh, not a second from now (the final word)."""
        self._read_t = None

    def refresh(
        self, now: float, *, quiet_follower: bool, expected: int | None
    ) -> dict[int, NodeRecord] | None:
        """The records when they changed since the last call (else None), at most once a second.

        `quiet_follower`: a launcher of node 1 and up whose job has started and which does not
        pull the other nodes' summaries: once every node has recorded itself, it reads only
        node 0's record (the lead it follows) every second and all of them now and then: N
        launchers each reading N records a second would load a shared file system as N x N.
        (Before the start, a node whose launcher ends without starting its part must be seen at
        once: see launch/supervise.py.)"""
        if self._read_t is not None and 0 <= now - self._read_t < NODES_EVERY_S:
            return None
        self._read_t = now
        full = self._full_t
        if (
            quiet_follower
            and full is not None
            and 0 <= now - full < NODES_FULL_EVERY_S
            and len(self.nodes) >= (expected or 0)
        ):
            lead = self.reader.read(0)
            records = {**self.nodes, 0: lead} if lead is not None else dict(self.nodes)
        else:
            self._full_t = now
            records = self.reader.read_all()
        if records == self.nodes:
            return None
        self.nodes = records
        return records
