"""Ctrl-C to one node's `ddpdoctor run` is recorded at once in its node record, so that every
other node's launcher stops its part as interrupted too; the closing lines say where it came from."""

from __future__ import annotations

import signal

from ddpdoctor.launch.launcher import Interrupts
from ddpdoctor.launch.supervise import peer_stop
from ddpdoctor.protocol.node_records import (
    STOPPED_INTERRUPTED,
    NodeRecord,
    NodeRecorder,
    read_node_records,
)
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.verdicts import Verdict


def test_an_interrupt_is_recorded_at_once_and_the_other_nodes_follow_it(tmp_path):
    run = RunDir.create(tmp_path / "run")
    recorder = NodeRecorder(run, NodeRecord(1, "h2", 4242))
    interrupts = Interrupts(recorder=recorder)
    interrupts.note(signal.SIGINT)
    interrupts.note(signal.SIGINT)  # a second Ctrl-C records nothing new
    records = read_node_records(run)
    assert records[1].stopped_for == STOPPED_INTERRUPTED and not records[1].ended
    assert peer_stop(records, 0) is Verdict.INTERRUPTED  # node 0 stops its part with it
    assert peer_stop(records, 1) is None  # (its own record is not a peer's)


def test_a_one_node_run_records_nothing(tmp_path):
    interrupts = Interrupts()
    interrupts.note(signal.SIGTERM)
    assert interrupts.signum == signal.SIGTERM
