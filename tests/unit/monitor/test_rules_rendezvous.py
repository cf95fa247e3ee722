"""A job over several nodes that waits for a node whose launcher never recorded itself."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.findings import Severity
from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import rendezvous
from ddpdoctor.monitor.model.snapshot import RankState, RunInfo, Snapshot
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.tell.diagnosis_text import status_line, verdict_line
from ddpdoctor.protocol.node_records import NodeRecord

COMMAND = (
    "ddpdoctor", "run", "--nnodes", "3", "--node-rank", "0", "--rdzv-backend", "c10d",
    "--rdzv-endpoint", "10.0.0.1:29400", "--run-dir", "/shared/run",
)  # fmt: skip


def waiting(elapsed: float, *, live: bool = True, missing=(1,)) -> Snapshot:
    info = RunInfo(
        name="r", run_dir="/shared/run", world_size=3, nnodes=3, started_t=0.0, command=COMMAND
    )
    return Snapshot(run=info, taken_t=elapsed, ranks=(), nodes_missing=missing, live=live)


def test_a_short_wait_is_information_naming_the_node_and_its_command():
    (finding,) = rendezvous.detect(waiting(4.0)).findings
    assert finding.id == "run.nodes_missing" and finding.severity is Severity.INFO
    assert finding.summary.startswith("waiting for node 1 to join the rendezvous (4.0 s so far)")
    assert (
        "`ddpdoctor run --nnodes 3 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint "
        "10.0.0.1:29400 --run-dir /shared/run`" in finding.fix
    )
    assert finding.evidence[0].text == "no nodes/node-1/node.json in /shared/run"


def test_a_long_wait_warns_and_a_run_that_ended_waiting_is_an_error():
    (late,) = rendezvous.detect(waiting(rendezvous.LONG_JOIN_WAIT_S + 1)).findings
    assert late.severity is Severity.WARNING
    (over,) = rendezvous.detect(waiting(600.0, live=False, missing=(1, 2))).findings
    assert over.severity is Severity.ERROR
    assert over.summary.startswith("nodes 1, 2 never joined the rendezvous, so no rank started")
    assert "(and likewise on nodes 1, 2)" in over.fix


def test_text_views_say_what_is_awaited_and_that_it_never_started():
    live = waiting(12.0)
    assert status_line(live).endswith("waiting for node 1 to join")
    over = waiting(600.0, live=False)
    assert over.never_started
    assert verdict_line(over).plain == "NOT STARTED: node 1 never joined the rendezvous"
    assert [f.id for f in diagnose(over).findings] == ["run.nodes_missing"]


def test_nothing_missing_gives_nothing():
    assert rendezvous.detect(waiting(100.0, missing=())) is None
    assert not replace(waiting(100.0), live=True).never_started


def test_command_for_node_handles_both_spellings():
    assert rendezvous.command_for_node(["x", "--node-rank=0", "y"], 2) == [
        "x",
        "--node-rank=2",
        "y",
    ]
    assert rendezvous.command_for_node(["x", "--node-rank", "0"], 2) == ["x", "--node-rank", "2"]


def test_the_state_names_launchers_missing_only_until_a_rank_starts():
    state = RunState(RunInfo(name="r", run_dir="/r", world_size=4, nnodes=2))
    assert state.snapshot(1.0).nodes_missing == ()  # no records: not a ddpdoctor multi-node run
    state.set_nodes({0: NodeRecord(0, "vm", 10, torchrun_pid=100)})
    assert state.snapshot(1.0).nodes_missing == (1,)
    state.apply({"kind": "hello", "rank": 0, "t": 2.0, "host": "vm", "pid": 1000, "ppid": 100})
    snap = state.snapshot(3.0)
    assert snap.nodes_missing == () and snap.rank(0).state is not RankState.GONE
