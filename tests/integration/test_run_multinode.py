"""A job that spans nodes, rehearsed on one host: two `ddpdoctor run --nnodes 2` launchers (each with
its own torchrun agent, c10d rendezvous on localhost) writing into one run directory.

One healthy run and one injected hang, each shared by its tests. Which rank lands under which
launcher is torchrun's choice (c10d numbers the nodes itself and ignores --node-rank), so the
tests find each rank's launcher the way the monitor does: the node record whose torchrun is the
rank's parent process.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.node_records import read_node_records
from ddpdoctor.protocol.node_summary import read_node_summary
from ddpdoctor.protocol.rundir import RunDir
from tests.procs import background, clean_env, ddpdoctor_cmd, free_port, job_processes, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

LAUNCH_TIMEOUT_S = 120


@dataclass
class NodeRun:
    node: int
    returncode: int
    stdout: str
    stderr: str
    pid: int


def launch_two_nodes(
    run_dir: Path, cache: Path, *extra: str, shown: list | None = None
) -> list[NodeRun]:
    """Start both launchers at once, wait for both (bounded), and return how each ended.
    `shown`: filled with every (verdict, culprits) diagnosis.json showed while they ran."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache)})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--run-dir", str(run_dir), "--nproc", "1", *extra,
    ]  # fmt: skip
    cmds = [ddpdoctor_cmd(*common, "--node-rank", str(node)) for node in (0, 1)]
    stop = threading.Event()
    recorder = threading.Thread(target=record, args=(run_dir, shown, stop), daemon=True)
    with background(cmds[0], env=env) as first, background(cmds[1], env=env) as second:
        if shown is not None:
            recorder.start()
        results = []
        for node, proc in enumerate((first, second)):
            try:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"node {node}'s launcher did not end within {LAUNCH_TIMEOUT_S} s")
            results.append(NodeRun(node, proc.returncode, out, err, proc.pid))
    stop.set()
    if recorder.is_alive():
        recorder.join(5)
    return results


def record(run_dir: Path, shown: list, stop: threading.Event) -> None:
    """Every verdict diagnosis.json shows while the job runs (read every 50 ms)."""
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads((run_dir / "diagnosis.json").read_text())
            seen = (doc["verdict"], tuple(doc.get("culprits") or ()))
            if not shown or shown[-1] != seen:
                shown.append(seen)
        stop.wait(0.05)


def events(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [e for e in map(parse_event_line, lines) if e is not None]


def hello(run_dir: Path, rank: int) -> dict:
    return [e for e in events(run_dir, rank) if e["kind"] == "hello"][-1]


def owner_of(run_dir: Path, rank: int) -> int:
    """The node whose launcher started the rank (its torchrun is the rank's parent)."""
    said = hello(run_dir, rank)
    records = read_node_records(RunDir(run_dir))
    owners = [n for n, r in records.items() if r.torchrun_pid == said["ppid"]]
    assert len(owners) == 1, (said, records)
    return owners[0]


def explain(nodes: list[NodeRun]) -> str:
    return "\n".join(f"--- node {n.node}\n{n.stdout[-2500:]}\n{n.stderr[-1500:]}" for n in nodes)


def assert_nothing_left(run_dir: Path, nodes: list[NodeRun]) -> None:
    assert job_processes(run_dir) == []  # torchrun agents, ranks, loader workers
    for node in nodes:
        assert not psutil.pid_exists(node.pid) or psutil.Process(node.pid).status() == "zombie"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data-cache")


# -- healthy ---------------------------------------------------------------------------------


SHOWN: list[tuple[str, tuple[int, ...]]] = []  # every verdict the healthy run showed


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, cache) -> tuple[list[NodeRun], Path]:
    run_dir = tmp_path_factory.mktemp("multinode-healthy") / "run"
    return launch_two_nodes(run_dir, cache, "--steps", "4", shown=SHOWN), run_dir


def test_a_healthy_run_never_shows_a_problem_on_its_way(healthy):
    """Node 0's ranks end first while node 1's summary is up to a second and a half old: no
    verdict is told before node 1 covers that time (diagnosis.json, the status lines)."""
    nodes, _ = healthy
    assert SHOWN and SHOWN[-1][0] == "healthy", SHOWN
    assert {verdict for verdict, _ in SHOWN} <= {"running", "healthy"}, SHOWN
    for node in nodes:
        assert not re.findall(r"^(HANG|CRASH|MISMATCH)\b", node.stdout, re.M), node.stdout
        assert "node.summary_disputed" not in node.stdout, node.stdout  # (the launchers' own)


def test_both_launchers_exit_0_and_every_rank_left_events(healthy):
    nodes, run_dir = healthy
    assert [n.returncode for n in nodes] == [0, 0], explain(nodes)
    for node in nodes:
        assert "verdict: healthy (exit code 0)" in node.stdout
    for rank in (0, 1):
        said = hello(run_dir, rank)
        assert said["world_size"] == 2 and said["local_rank"] == 0
        assert [e["code"] for e in events(run_dir, rank) if e["kind"] == "exit"] == [0]
    # Each rank belongs to a different launcher.
    assert {owner_of(run_dir, 0), owner_of(run_dir, 1)} == {0, 1}
    assert_nothing_left(run_dir, nodes)


def test_each_node_keeps_its_own_logs_and_record(healthy):
    _, run_dir = healthy
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["nnodes"], meta["world_size"], meta["node_rank"]) == (2, 2, 0)
    records = read_node_records(RunDir(run_dir))
    assert sorted(records) == [0, 1]
    for node, record in records.items():
        logs = run_dir / record.log_dir
        assert logs == run_dir / "logs" / record.host / f"node-{node}"
        agent_log = (logs / "torchrun.log").read_text()
        assert "[default" not in agent_log  # torchrun's own lines; the rank has its own file
        (rank_log,) = logs.glob("*/attempt_0/0/stdout.log")
        rank = 0 if owner_of(run_dir, 0) == node else 1
        if rank == 0:
            assert "parameters identical on all 2 ranks" in rank_log.read_text()
        assert (record.exit_code, record.torchrun_exit_code, record.stopped_for) == (0, 0, None)
        assert record.ended_t is not None and record.launcher_pid != record.torchrun_pid


def test_watch_shows_every_rank_of_both_nodes(healthy):
    _, run_dir = healthy
    result = run(ddpdoctor_cmd("watch", str(run_dir), "--json"), timeout=60)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "healthy"
    assert [(r["rank"], r["state"]) for r in doc["ranks"]] == [(0, "done"), (1, "done")]
    assert doc["run"]["world_size"] == 2


def test_each_launcher_publishes_a_summary_of_its_own_ranks(healthy):
    _, run_dir = healthy
    for node in (0, 1):
        summary = read_node_summary(RunDir(run_dir), node)
        assert summary is not None and summary.node_rank == node
        ranks = [r.rank for r in summary.ranks]
        assert ranks and all(owner_of(run_dir, rank) == node for rank in ranks)
        # its last summary, written as it ended, carries its ranks' exits (in the whole digest;
        # the head has only what the summary before it did not)
        full = summary.full()
        assert full is not None and [r.rank for r in full] == ranks
        exits = [e for r in full for _, e in r.events if e["kind"] == "exit"]
        assert [e["code"] for e in exits] == [0] * len(ranks)
        assert all(
            r.last == max(n for n, _ in f.events) for r, f in zip(summary.ranks, full, strict=True)
        )


# -- hang ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hang(tmp_path_factory, cache) -> tuple[list[NodeRun], Path]:
    run_dir = tmp_path_factory.mktemp("multinode-hang") / "run"
    extra = ("--steps", "30", "--inject", "hang:rank=1,step=3", "--hang-after", "2")
    return launch_two_nodes(run_dir, cache, *extra), run_dir


def test_hang_is_diagnosed_and_both_launchers_exit_1_leaving_nothing(hang):
    nodes, run_dir = hang
    assert [n.returncode for n in nodes] == [1, 1], explain(nodes)
    for node in nodes:
        assert "verdict: hang (exit code 1)" in node.stdout
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    assert diagnosis["verdict"] == "hang" and diagnosis["culprits"] == [1]
    stacked = sorted(r for group in diagnosis["stacks"] for r in group["ranks"])
    assert stacked == [0, 1], explain(nodes)  # both nodes' ranks, in one view (its "stacks:" line)
    culprit_frames = next(g["frames"] for g in diagnosis["stacks"] if 1 in g["ranks"])
    assert any("_inject_hang" in frame for frame in culprit_frames)
    assert_nothing_left(run_dir, nodes)


def test_launchers_stop_their_own_torchrun(hang):
    _, run_dir = hang
    records = read_node_records(RunDir(run_dir))
    assert {n: r.stopped_for for n, r in records.items()} == {0: "hang", 1: "hang"}
    assert {n: r.exit_code for n, r in records.items()} == {0: 1, 1: 1}


def test_the_other_nodes_stack_came_from_its_own_launcher_through_node_0s_request(hang):
    """Node 0's launcher leads: it dumps its own node's rank and asks for the other node's
    (the culprit or its victim, as torchrun numbered the nodes), which that node's launcher
    dumps: py-spy attaches on its own host only."""
    _, run_dir = hang
    remote = next(rank for rank in (0, 1) if owner_of(run_dir, rank) == 1)
    requests_dir = run_dir / "requests"
    stack_requests = [  # requests/ also holds the monitors' flight-recorder requests (fr-*)
        json.loads(p.read_text())
        for p in requests_dir.glob("*.json")
        if not p.name.startswith("fr-")
    ]
    asked = [r for r in stack_requests if r["asked_by"]["node"] == 0]
    assert len(asked) == 1 and asked[0]["ranks"] == [remote]  # node 0 asked for node 1's rank
    request_id = asked[0]["id"]
    answer = json.loads((requests_dir / f"{request_id}.node1.done").read_text())
    assert answer["ranks"] == [remote] and answer["errors"] == {}
    capture = run_dir / "stacks" / answer["capture_id"]
    summary = json.loads((capture / "capture.json").read_text())
    assert summary["captured_by"]["node"] == 1
    assert summary["captured_by"]["role"] == "launcher"
    assert summary["request_id"] == request_id
    dump = json.loads((capture / f"rank-{remote}.json").read_text())
    assert dump[0]["pid"] == hello(run_dir, remote)["pid"]


# -- a node whose doctor fails ---------------------------------------------------------------


def test_a_node_whose_doctor_fails_ends_the_others_wait_at_once(tmp_path, cache):
    """Node 1's preflight doctor fails (on this host the name resolves to a loopback address,
    which a multi-node job cannot use), so it never starts torchrun; node 0's launcher, already
    in the rendezvous, stops at once instead of waiting out torchrun's 600 s rendezvous timeout."""
    run_dir = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache)})
    common = [
        "run", "--no-tui", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        endpoint, "--run-dir", str(run_dir), "--nproc", "1",
    ]  # fmt: skip
    waiting = ddpdoctor_cmd(*common, "--node-rank", "0", "--no-doctor")
    with background(waiting, env=env) as first:
        doctor = run(ddpdoctor_cmd(*common, "--node-rank", "1"), env=env, timeout=90)
        assert doctor.returncode == 1, doctor.stdout[-2000:] + doctor.stderr[-2000:]
        assert (
            "the doctor failed a check about this machine or launch, so the job was not started"
            in doctor.stdout
        )
        try:
            out, err = first.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("node 0's launcher kept waiting for node 1")
    assert first.returncode == 1, out[-2000:] + err[-2000:]
    assert "node 1's launcher ended before starting its part of the job" in out
    assert "verdict: not started (exit code 1)" in out
    assert (run_dir / "nodes" / "node-1" / "doctor.json").exists()
    assert job_processes(run_dir) == []


# -- a node that never joins -----------------------------------------------------------------


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_node_that_never_joins_is_named_while_waited_for_and_after_the_join_timeout(
    shared_runs,
):
    """Only node 0's launcher is started: it says which node it waits for, then, once torchrun's
    rendezvous gives up (--join-timeout), that the job never started and why. The run is one of
    the session's shared runs (conftest's NODE_NEVER_JOINS: --nnodes 2 --node-rank 0
    --join-timeout 6 --json)."""
    result = shared_runs["node-never-joins"]
    run_dir = result.run_dir
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "waiting for node 1 to join" in result.stderr  # the live status (--json: on stderr)
    assert "NOT STARTED: node 1 never joined the rendezvous" in result.stderr
    assert "verdict: not started (exit code 1)" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["job"]["started"] is False and doc["nodes_missing"] == [1]
    finding = next(f for f in doc["findings"] if f["id"] == "run.nodes_missing")
    assert finding["severity"] == "error" and "--node-rank 1" in finding["fix"]
    assert job_processes(run_dir) == []
    said = run(ddpdoctor_cmd("explain", "--json", str(run_dir)), timeout=60)
    ids = [f["id"] for f in json.loads(said.stdout)["findings"]]
    assert ids == ["c10d.rendezvous_timeout"]
