"""`ddpdoctor doctor --distributed` with real launchers and processes on this machine.

Two torchrun agents (c10d rendezvous) stand in for two nodes, one of them with NCCL_IB_DISABLE=1;
srun is played by plain processes carrying recorded SLURM_* variables; a missing node is a rank
that is never started. Every process runs in its own group with a timeout (tests.procs). The
module's three runs of two ranks start at once, in one fixture.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.procs import PYTHON, Finished, background, clean_env, ddpdoctor_cmd, free_port

pytestmark = pytest.mark.integration


def run_together(
    commands: Sequence[tuple[list[str], Mapping[str, str]]], *, timeout: float
) -> list[Finished]:
    """Start every command at once; wait for all within `timeout`; kill all groups after."""
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd, env in commands]
        finished = []
        for proc, (cmd, _) in zip(procs, commands, strict=True):
            remaining = max(0.1, timeout - (time.monotonic() - start))
            try:
                out, err = proc.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}")
            finished.append(Finished(proc.returncode, out, err, time.monotonic() - start))
    return finished


def torchrun_agent(port: int, *args: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "ddpdoctor-test",
        "--max-restarts",
        "0",
        "-m",
        "ddpdoctor",
        *args,
    ]


def _torchrun_pair(junit: Path) -> dict:
    """Both agents run the distributed doctor with --json and --junit-xml; agent B plants
    NCCL_IB_DISABLE=1."""
    port = free_port()
    args = ("doctor", "--distributed", "--json", "--junit-xml", str(junit), "--timeout", "40")
    agent_a = (torchrun_agent(port, *args), clean_env())
    agent_b = (torchrun_agent(port, *args), clean_env({"NCCL_IB_DISABLE": "1"}))
    a, b = run_together([agent_a, agent_b], timeout=120)
    reports = [json.loads(r.stdout) for r in (a, b) if r.stdout.strip()]
    return {"agents": (a, b), "reports": reports, "junit": junit}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """This module's three doctor runs of two ranks each, at once (most of each is a wait): the
    torchrun pair the first tests share, the srun tasks with a broken link, and two ranks that
    never meet. A run that fails its own bound fails every test that reads it."""
    junit = tmp_path_factory.mktemp("junit") / "doctor.xml"
    scenarios = {
        "torchrun_pair": lambda: _torchrun_pair(junit),
        "srun_broken_link": _srun_broken_link,
        "lonely_ranks": _lonely_ranks,
    }
    with ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        started = {name: pool.submit(run) for name, run in scenarios.items()}
        return {name: future.result() for name, future in started.items()}


@pytest.fixture(scope="module")
def torchrun_pair(runs) -> dict:
    return runs["torchrun_pair"]


@pytest.mark.timeout(150)
def test_rank_0_alone_prints_one_report_and_every_rank_exits_with_its_code(torchrun_pair):
    a, b = torchrun_pair["agents"]
    reports = torchrun_pair["reports"]
    assert len(reports) == 1, (a.stdout[-2000:], b.stdout[-2000:], a.stderr[-3000:])
    document = reports[0]
    assert a.returncode == b.returncode == document["exit_code"], (
        a.stderr[-3000:],
        b.stderr[-3000:],
    )
    # torchrun prints its own ChildFailedError traceback for a rank that exits 1; none of ours.
    assert "ddpdoctor/" not in a.stderr + b.stderr


@pytest.mark.timeout(150)
def test_planted_nccl_difference_names_the_node(torchrun_pair):
    document = torchrun_pair["reports"][0]
    cluster = document["cluster"]
    assert (cluster["launcher"], cluster["world_size"], cluster["joined"]) == ("torchrun", 2, 2)
    assert cluster["missing_ranks"] == []
    planted = [r for r in cluster["ranks"] if r["env"].get("NCCL_IB_DISABLE") == "1"]
    assert len(planted) == 1
    odd, host = planted[0], planted[0]["host"]
    other = next(r for r in cluster["ranks"] if r is not odd)
    result = next(r for r in document["results"] if r["id"] == "cluster.env")
    assert result["status"] == "fail"
    assert result["summary"] == (
        f"NCCL_IB_DISABLE: 1 on node {odd['node']} ({host}, rank {odd['rank']}); "
        f"unset on node {other['node']} ({other['host']}, rank {other['rank']})"
    )
    # torchrun numbered the nodes (GROUP_RANK): the two agents share a host name, not a node.
    assert sorted(n["node_rank"] for n in cluster["nodes"]) == [0, 1]


@pytest.mark.timeout(150)
def test_every_check_per_node_and_the_collectives(torchrun_pair):
    document = torchrun_pair["reports"][0]
    cluster = document["cluster"]
    local_ids = [r["id"] for r in document["results"] if r["group"] != "cluster"]
    assert local_ids, "the local checks ran on the ranks"
    assert not [i for i in local_ids if i.startswith("smoke.")]  # no local smoke tests
    assert [row["id"] for row in cluster["matrix"]] == local_ids
    for row in cluster["matrix"]:
        assert set(row["by_node"]) == {"0", "1"}
    results = {r["id"]: r for r in document["results"]}
    assert results["cluster.join"]["status"] == "pass"
    assert results["cluster.group"]["status"] == "pass"
    assert results["cluster.versions"]["status"] == "pass"
    allreduce = results["cluster.allreduce"]
    assert allreduce["status"] == "pass" and "correct" in allreduce["summary"]
    assert cluster["allreduce"]["busbw_gbps"] > 0
    assert cluster["allreduce"]["busbw_gbps"] == pytest.approx(cluster["allreduce"]["algbw_gbps"])
    (link,) = cluster["links"]
    assert (link["a"], link["b"], link["error"]) == (0, 1, None) and link["gbps"] > 0
    assert results["cluster.links"]["status"] == "pass"


@pytest.mark.timeout(150)
def test_junit_written_by_rank_0_alongside_json(torchrun_pair):
    document = torchrun_pair["reports"][0]
    root = ET.parse(torchrun_pair["junit"]).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert sorted(cases) == sorted(r["id"] for r in document["results"])
    env_case = cases["cluster.env"]
    assert env_case.get("classname") == "cluster"
    failure = env_case.find("failure")
    assert failure is not None and "NCCL_IB_DISABLE" in (failure.get("message") or "")


def slurm_task(rank: int, port: int, **extra: str) -> dict[str, str]:
    """The SLURM_* variables srun gives task `rank` of a 2-node, 1-task-per-node step."""
    return clean_env(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "MASTER_PORT": str(port),  # the job id's port might be taken on a shared machine
            "PYTHONIOENCODING": "utf-8",  # the report's status symbols, whatever the locale
            **extra,
        }
    )


def _srun_broken_link() -> list[Finished]:
    port = free_port()
    # A generous join timeout (both ranks start together, but a loaded machine may start one
    # late); the broken link costs the fixed pair timeout (5 s), not this.
    cmd = ddpdoctor_cmd("doctor", "--distributed", "--timeout", "20", "launcher", "cluster")
    fault = {"DDPDOCTOR_TEST_LINK_FAULT": "silent:rank=1"}
    return run_together(
        [(cmd, slurm_task(0, port, **fault)), (cmd, slurm_task(1, port, **fault))], timeout=90
    )


@pytest.mark.timeout(150)
def test_srun_tasks_and_a_broken_link_in_text(runs):
    """srun without torchrun: ranks and master come from SLURM_*; rank 1 is made to never answer
    its pairwise exchange (a test switch), so the link check must fail naming both nodes."""
    rank0, rank1 = runs["srun_broken_link"]
    assert rank1.stdout == ""
    assert rank0.returncode == rank1.returncode == 1, rank0.stdout + rank0.stderr + rank1.stderr
    text = " ".join(rank0.stdout.split())  # the report wraps at the terminal width
    assert "ddpdoctor doctor --distributed slurm, 2 ranks on 2 nodes" in text
    assert "MASTER_ADDR 127.0.0.1 (127.0.0.1) reached from all 2 ranks" in text
    assert re.search(
        r"✗ Links between nodes \(pairwise send/recv\): node 0 \(\S+\) <-> node 1 \(\S+\): "
        r"RuntimeError: Timed out",
        text,
    ), text
    assert re.search(r"✓ launcher\.slurm ✓ ✓", text)  # Slurm's view, checked on both ranks
    assert "Traceback" not in rank0.stderr + rank1.stderr


def _lonely_ranks() -> tuple[list[Finished], int]:
    port_a, port_b = free_port(), free_port()
    base = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "LOCAL_WORLD_SIZE": "1"}
    lonely_rank0 = (
        ddpdoctor_cmd("doctor", "--distributed", "--timeout", "3", "--json", "cluster"),
        clean_env({**base, "RANK": "0", "MASTER_PORT": str(port_a)}),
    )
    lonely_rank1 = (
        ddpdoctor_cmd("doctor", "--distributed", "--timeout", "3"),
        clean_env({**base, "RANK": "1", "MASTER_PORT": str(port_b)}),
    )
    return run_together([lonely_rank0, lonely_rank1], timeout=60), port_b


@pytest.mark.timeout(150)
def test_missing_rank_is_named_within_the_timeout_and_absent_rank_0_too(runs):
    (first, second), port_b = runs["lonely_ranks"]
    # bounded by --timeout, not c10d's 15 minutes
    assert first.elapsed_s < 45 and second.elapsed_s < 45

    assert first.returncode == 1, first.stderr
    document = json.loads(first.stdout)
    assert document["exit_code"] == 1
    assert document["cluster"]["missing_ranks"] == [1]
    join = next(r for r in document["results"] if r["id"] == "cluster.join")
    assert join["status"] == "fail"
    assert join["summary"].startswith("rank 1 never joined (expected on node 1) within 3 s")
    assert "join_timeout" in join["fix"]

    assert second.returncode == 1
    assert second.stdout == ""
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(
        f"ddpdoctor: error: rank 1: nothing answered at MASTER_ADDR:MASTER_PORT 127.0.0.1:{port_b}"
    )


@pytest.mark.timeout(60)
def test_without_a_launcher_is_a_usage_error():
    from tests.procs import run

    finished = run(ddpdoctor_cmd("doctor", "--distributed"), timeout=30, env=clean_env())
    assert finished.returncode == 2
    assert finished.stderr.strip().startswith("ddpdoctor: error: --distributed needs a launcher")
    assert finished.stderr.count("\n") == 1


@pytest.mark.timeout(60)
def test_allreduce_check_catches_silent_corruption():
    """A collective that returns wrong data without an error (as broken GPU P2P does) must fail:
    one real gloo rank whose all_reduce result is tampered with after the fact."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.distributed_doctor.collective_bench import BenchConfig, run_bench

    class Tampering:
        def __getattr__(self, name):
            return getattr(dist, name)

        def all_reduce(self, tensor, **kwargs):
            work = dist.all_reduce(tensor, **kwargs)
            tensor[5] += 1
            return work

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        config = BenchConfig(allreduce_bytes=4096, pair_bytes=4096, iterations=1)
        honest = run_bench(
            dist,
            torch,
            rank=0,
            world=1,
            participants=[0],
            device="cpu",
            backend="gloo",
            config=config,
        )
        tampered = run_bench(
            Tampering(),
            torch,
            rank=0,
            world=1,
            participants=[0],
            device="cpu",
            backend="gloo",
            config=config,
        )
    finally:
        dist.destroy_process_group()
    assert honest.allreduce.correct and honest.allreduce.seconds and not honest.pairs
    assert not tampered.allreduce.correct
    assert tampered.allreduce.bad_ranks == (0,)
    assert tampered.allreduce.first_error == "element 5: expected 1005.0, got 1006.0"


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_rank_runs_the_collective_check_on_nccl_and_reports_its_gpu():
    """On a GPU machine: one rank, its GPU's UUID as NVML knows it, all_reduce over NCCL."""
    import pynvml

    from tests.procs import run

    env = clean_env(
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
    )
    finished = run(
        ddpdoctor_cmd("doctor", "--distributed", "--json", "cluster"), timeout=90, env=env
    )
    document = json.loads(finished.stdout)
    cluster = document["cluster"]
    assert cluster["allreduce"]["backend"] == "nccl"
    results = {r["id"]: r for r in document["results"]}
    assert results["cluster.allreduce"]["status"] == "pass"
    assert results["cluster.gpus"]["status"] == "pass"
    pynvml.nvmlInit()
    try:
        uuids = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            uuids.add(uuid.decode() if isinstance(uuid, bytes) else uuid)
    finally:
        pynvml.nvmlShutdown()
    assert cluster["ranks"][0]["gpu_uuid"] in uuids
    assert cluster["ranks"][0]["versions"]["driver"]
