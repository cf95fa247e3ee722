"""diagnosis.json: what a monitor writes besides the snapshot, and whose final document stands.

On a job over several nodes every launcher keeps its own diagnosis, but the run directory holds
one `diagnosis.json`: node 0's final one stands (node 0 leads, as in run.json). Its stop waited
for the stacks of every node; a follower that stops after it may have asked node 0 for stacks
once its ranks were gone, and its diagnosis would then lack them.
"""

from __future__ import annotations

import os
from typing import Any

from ddpdoctor.protocol.node_records import read_node_records
from ddpdoctor.protocol.rundir import RunDir


def writer_record(node_rank: int | None) -> dict[str, Any]:
    """The document's `writer`: the launcher's node (None on one node, and for `watch`), pid."""
    return {"node_rank": node_rank, "pid": os.getpid()}


def lead_wrote_the_final(run: RunDir, node_rank: int | None, previous: Any) -> bool:
    """Whether node `node_rank` (1 and up) must leave `previous`, the diagnosis.json in place,
    alone: node 0's launcher wrote it as its final one.

    The document names its writer: node 0 writes its final one before its node record says it
    ended, and a follower that went by the record alone wrote over it in between. A document
    of a ddpdoctor before `writer` stands once node 0's record says it ended."""
    if not node_rank:  # one node (None), or node 0 itself
        return False
    if not isinstance(previous, dict) or previous.get("final") is not True:
        return False
    writer = previous.get("writer")
    if isinstance(writer, dict):
        return writer.get("node_rank") == 0
    lead = read_node_records(run).get(0)
    return lead is not None and lead.ended
