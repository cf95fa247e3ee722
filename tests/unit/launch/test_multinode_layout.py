"""A job that spans nodes: per-node folders, node records, which launcher owns which rank, the log
files of two agents on one host mapped to the right global ranks, and the launchers' stop rules."""

from __future__ import annotations

import json

import pytest

from ddpdoctor import cli
from ddpdoctor.errors import UsageError
from ddpdoctor.launch.plan import plan_from_args
from ddpdoctor.launch.supervise import FOLLOWER_GRACE_S, STACK_WAIT_S, StopPolicy, peer_stop
from ddpdoctor.monitor.follow.runinfo import with_nodes
from ddpdoctor.monitor.model.snapshot import RunInfo, Snapshot, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.node_records import NodeRecord, NodeRecorder, node_of, read_node_records
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.torchrun_logs import AGENT_LOG, RANK_LOG, classify_log_path

T0 = 1_700_000_000.0
# c10d numbered the nodes itself: node 0's torchrun (pid 100) got GROUP_RANK 1.
RECORDS = {
    0: NodeRecord(0, "vm", 10, torchrun_pid=100, log_dir="logs/vm/node-0"),
    1: NodeRecord(1, "vm", 11, torchrun_pid=200, log_dir="logs/vm/node-1"),
}


def hello(rank: int, *, ppid: int, group_rank: int, local_rank: int = 0) -> dict:
    return {
        "v": 1, "t": T0, "mono": 0.0, "rank": rank, "kind": "hello", "host": "vm",
        "pid": 1000 + rank, "ppid": ppid, "group_rank": group_rank, "local_rank": local_rank,
        "world_size": 4,
    }  # fmt: skip


def two_agents_on_one_host() -> RunState:
    state = RunState(RunInfo(name="r", run_dir="/r", world_size=4, nnodes=2))
    # node 1's torchrun (pid 200) holds ranks 0-1 (GROUP_RANK 0); node 0's holds ranks 2-3.
    for rank in range(4):
        ppid, group = (200, 0) if rank < 2 else (100, 1)
        state.apply(hello(rank, ppid=ppid, group_rank=group, local_rank=rank % 2))
    return state


def test_paths_of_a_node(tmp_path):
    run = RunDir.create(tmp_path / "run")
    assert run.node_logs_dir(None, "vm") == run.logs_dir / "vm"
    assert run.node_logs_dir(1, "vm") == run.logs_dir / "vm" / "node-1"
    assert run.node_json(2) == run.path / "nodes" / "node-2" / "node.json"
    assert run.doctor_json_for(None) == run.path / "doctor.json"
    assert run.doctor_json_for(1) == run.path / "nodes" / "node-1" / "doctor.json"


def test_log_paths_of_two_agents_on_one_host():
    agent = classify_log_path(("logs", "vm", "node-1", "torchrun.log"))
    assert (agent.kind, agent.host, agent.node, agent.agent_key) == (
        AGENT_LOG,
        "vm",
        1,
        "vm node 1",
    )
    assert agent.label(None) == "torchrun vm node 1"
    parts = ("logs", "vm", "node-0", "none_ab", "attempt_0", "1", "stderr.log")
    rank_log = classify_log_path(parts)
    assert (rank_log.kind, rank_log.node, rank_log.local_rank, rank_log.stream) == (
        RANK_LOG, 0, 1, "stderr"
    )  # fmt: skip
    one_node = classify_log_path(("logs", "vm", "none_ab", "attempt_0", "1", "stdout.log"))
    assert (one_node.kind, one_node.node, one_node.local_rank) == (RANK_LOG, None, 1)
    assert classify_log_path(("logs", "vm", "torchrun.log")).agent_key == "vm"


def test_rank_logs_map_through_the_node_records_not_the_group_rank():
    state = two_agents_on_one_host()
    state.set_nodes(RECORDS)
    assert [state.node_of(r) for r in range(4)] == [1, 1, 0, 0]
    node0 = ("logs", "vm", "node-0", "none_ab", "attempt_0", "1", "stdout.log")
    node1 = ("logs", "vm", "node-1", "none_cd", "attempt_0", "1", "stdout.log")
    assert state.rank_of(classify_log_path(node0)) == 3
    assert state.rank_of(classify_log_path(node1)) == 1
    # Without records (a static rendezvous keeps --node-rank), GROUP_RANK names the node.
    bare = two_agents_on_one_host()
    assert bare.rank_of(classify_log_path(node0)) == 1
    assert bare.node_of(3) == 1


def test_agent_logs_of_two_nodes_on_one_host_stay_apart():
    state = two_agents_on_one_host()
    for node in (0, 1):
        source = classify_log_path(("logs", "vm", f"node-{node}", "torchrun.log"))
        state.apply_log_lines(source, [(1, f"agent {node} line")])
    assert sorted(state.agent_files) == ["vm node 0", "vm node 1"]
    assert {line.source for line in state.logs} == {"torchrun vm node 0", "torchrun vm node 1"}


def test_node_of_prefers_the_parent_torchrun():
    assert node_of(RECORDS, host="vm", ppid=100, group_rank=1) == 0
    assert node_of(RECORDS, host="other", ppid=100, group_rank=1) == 1  # another host's pid 100
    assert node_of({}, host="vm", ppid=100, group_rank=None) is None


def test_node_records_round_trip_and_junk_is_ignored(tmp_path):
    run = RunDir.create(tmp_path / "run")
    recorder = NodeRecorder(run, NodeRecord(1, "vm", 11, log_dir="logs/vm/node-1", nproc=2))
    recorder.started(200, T0)
    recorder.stopped("hang")
    recorder.ended(1, -15, T0 + 9)
    (run.nodes_dir / "node-7").mkdir()
    (run.nodes_dir / "node-7" / "node.json").write_text('{"schema_version": 1, "node_ra')
    (run.nodes_dir / "node-8").mkdir()  # a record filed under another node's folder
    (run.nodes_dir / "node-8" / "node.json").write_text(json.dumps(recorder.record.to_json()))
    (run.nodes_dir / "stray").mkdir()
    records = read_node_records(run)
    assert list(records) == [1]
    record = records[1]
    assert (record.torchrun_pid, record.stopped_for, record.exit_code) == (200, "hang", 1)
    assert (record.torchrun_exit_code, record.ended) == (-15, True)


def test_run_info_names_every_nodes_host():
    info = RunInfo(name="r", run_dir="/r", hosts=("a",), nnodes=None)
    records = {0: NodeRecord(0, "a", 1), 1: NodeRecord(1, "b", 2)}
    merged = with_nodes(info, records)
    assert (merged.hosts, merged.nnodes) == (("a", "b"), 2)
    assert with_nodes(info, {}) is info


def plan(*argv: str):
    return plan_from_args(cli.parse_args(["run", *argv]), gpu_count=lambda: 0, argv=argv)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--nnodes", "2"], ["--node-rank", "--rdzv-endpoint"]),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1"], ["missing --node-rank (this node's"]),
        (["--nnodes", "2", "--node-rank", "0"], ["missing --rdzv-endpoint"]),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], ["outside --nnodes"]),
    ],
)
def test_several_nodes_need_a_node_rank_and_a_meeting_point(argv, words):
    with pytest.raises(UsageError) as caught:
        plan(*argv)
    for word in words:
        assert word in str(caught.value)


def test_the_node_rank_names_the_launcher_only_when_the_job_spans_nodes():
    assert plan().node_rank is None
    assert plan("--nnodes", "1", "--node-rank", "0", "--master-addr", "h").node_rank is None
    spans = plan("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1", "--nproc", "1")
    assert spans.node_rank == 1 and spans.world_size == 2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hang_snapshot() -> Snapshot:
    return Snapshot(
        run=RunInfo(name="r", run_dir="/r"), taken_t=0.0, ranks=(), verdict=Verdict.HANG,
        stack_status="captured 2 ranks at 10:00:00", confirmed=True,
    )  # fmt: skip


def test_a_follower_stops_with_the_lead_or_after_a_grace():
    clock = Clock()
    follower = StopPolicy(keep_running=False, clock=clock, follower=True)
    assert follower.observe(hang_snapshot(), job_running=True).stop is None  # stacks settled
    clock.now += STACK_WAIT_S
    assert follower.observe(hang_snapshot(), job_running=True).stop is None
    clock.now += FOLLOWER_GRACE_S
    assert follower.observe(hang_snapshot(), job_running=True).stop is Verdict.HANG
    peer = StopPolicy(keep_running=False, clock=Clock(), follower=True)
    healthy = Snapshot(run=RunInfo(name="r", run_dir="/r"), taken_t=0.0, ranks=())
    decision = peer.observe(healthy, job_running=True, peer_stopped=Verdict.HANG)
    assert decision.stop is Verdict.HANG and peer.stopped_for is Verdict.HANG
    kept = StopPolicy(keep_running=True, clock=Clock(), follower=True)
    assert kept.observe(healthy, job_running=True, peer_stopped=Verdict.HANG).stop is None


def test_a_peers_stop_is_read_from_the_node_records():
    stopped = {**RECORDS, 1: RECORDS[1].with_(stopped_for="hang")}
    assert peer_stop(stopped, 0) is Verdict.HANG
    assert peer_stop(stopped, 1) is None  # its own stop is not a peer's
    assert peer_stop(stopped, None) is None
    assert peer_stop({1: RECORDS[1].with_(stopped_for="nonsense")}, 0) is None
