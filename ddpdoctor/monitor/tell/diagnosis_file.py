"""diagnosis.json: what a monitor writes besides the snapshot, and whose final document stands.

On a job over several nodes every launcher keeps its own diagnosis, but the run directory holds
one `diagnosis.json`: node 0's final one stands (node 0 leads, as in run.json). Its stop waited
for the stacks of every node; a follower that stops after it may have asked node 0 for stacks
once its ranks were gone, and its diagnosis would then lack them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ddpdoctor.monitor.judge.held import stop_record
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.protocol.node_records import read_node_records
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic


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


class DiagnosisWriter:
    """A monitor's diagnosis.json, written when what it says changes (the verdict, a finding and
    its severity, the culprits, new stacks or flight-recorder dumps), atomically; a run that has
    nothing to say yet gets no file. A write that fails is said once (`error`), never raised:
    the job goes on whatever its run directory does."""

    def __init__(self, run: RunDir, node_rank: int | None) -> None:
        self.run = run
        self.node_rank = node_rank
        self.written_key: tuple | None = None
        self.error: str | None = None

    def write(
        self,
        snap: Snapshot,
        *,
        force: bool,
        final: bool,
        held: RuleOutcome | None,
        previous: Callable[[], Any],
    ) -> None:
        """`previous` reads the diagnosis.json in place (only when it matters: another node's
        final one must stand)."""
        key = (
            snap.verdict,
            tuple((f.id, f.ranks, f.severity) for f in snap.findings),  # a wait escalates
            snap.culprits,
            len(snap.stacks),
            snap.finished,
            tuple((d.rank, d.request_id) for d in snap.flight_recorder)
            if snap.verdict.is_problem
            else (),
        )
        if not force and key == self.written_key:
            return
        if (
            not force
            and self.written_key is None
            and not snap.finished
            and snap.verdict is Verdict.RUNNING
            and not snap.findings
        ):
            return  # nothing to say yet: do not litter a fresh run directory
        self.written_key = key
        if lead_wrote_the_final(self.run, self.node_rank, previous()):
            return
        try:
            document = snap.diagnosis_json()
            document["final"] = final
            document["stopped_for"] = stop_record(held)
            document["writer"] = writer_record(self.node_rank)
            write_json_atomic(self.run.diagnosis_json, document)
        except OSError as exc:
            self.error = f"cannot write {self.run.diagnosis_json}: {exc.strerror or exc}"
