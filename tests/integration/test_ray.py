"""Ray jobs on real Ray, on one host: Ray Train's TorchTrainer and the RL stacks' pattern (actors
the job creates, which join a process group in a method), run as
`ddpdoctor run --no-tui --json -- python JOB.py MODE` (tests/corpus/ray/).

Two kinds of cluster: a local one that the job's `ray.init()` starts (it inherits the driver's
environment), and one already running (`ray start --head` on free ports, started by this module
before the jobs and stopped after them, never with `ray stop`, which would end every Ray
instance of the host): the job joins it through RAY_ADDRESS and its workers get ddpdoctor only
through Ray's runtime-env hook. Ray is heavy on two cores: one cluster for the module, the jobs
run together in one module fixture, each test reads what they left.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.procs import (
    REPO,
    JsonRun,
    clean_env,
    ddpdoctor_cmd,
    free_port,
    job_processes,
    run_json_jobs,
)

pytest.importorskip("ray.train.torch")

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(1200)]

CORPUS = REPO / "tests" / "corpus" / "ray"
RUN_TIMEOUT_S = 600
CLUSTER_START_S = 300
# Marks every process of the cluster this module starts (read back from /proc/<pid>/environ)
MARK = "DDPDOCTOR_TEST_RAY_CLUSTER"
JOBS = {
    # name: (script, mode, on the running cluster)
    "train-healthy-running": ("ray_train.py", "healthy", True),
    "train-stall-running": ("ray_train.py", "stall", True),
    "train-sigkill-local": ("ray_train.py", "sigkill", False),
    "actors-healthy-local": ("ray_actors.py", "healthy", False),
}
PARALLEL = 4
STEPS = 8


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == mark:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _end_marked(mark: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in _marked(mark):
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)


@dataclass
class Cluster:
    address: str
    mark: str
    head: subprocess.Popen


def _ray_env(**extra: str) -> dict[str, str]:
    env = clean_env()
    # the test's own shell may point at another cluster or hook: only `extra` names one
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_RUNTIME_ENV_HOOK", None)
    env.update(
        {
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            # a raylet may take longer than Ray's 60 s to register on a loaded 2-core machine
            "RAY_raylet_start_wait_time_s": "600",
            **extra,
        }
    )
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`ray start --head --block` on free ports, in a session of its own, every process of it
    marked; ended by the mark in teardown."""
    base = tmp_path_factory.mktemp("ray-head")
    temp_dir = Path("/tmp") / f"ddpd-ray-{os.getpid()}"  # Ray's socket paths must stay short
    port = free_port()
    mark = f"{os.getpid()}-{port}"
    ray = str(Path(sys.executable).parent / "ray")
    cmd = [
        ray, "start", "--head", "--block", f"--port={port}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}", "--num-cpus=4", "--include-dashboard=false",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    env = _ray_env(**{MARK: mark})
    with open(base / "head.log", "w") as log:
        head = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + CLUSTER_START_S
        while "--block" not in (base / "head.log").read_text(errors="replace"):
            assert head.poll() is None, (base / "head.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        yield Cluster(f"127.0.0.1:{port}", mark, head)
    finally:
        _end_marked(mark)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert _marked(mark) == [], "a process of the Ray cluster outlived it"


class Result(JsonRun):
    def context(self) -> str:
        return f"{self.stdout[-2000:]}\n{self.stderr[-4000:]}"


def _command(name: str, work: Path) -> list[str]:
    script, mode, _ = JOBS[name]
    return ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--json", "--run-dir", str(work / "run"),
        "--", sys.executable, str(CORPUS / script), mode,
    )  # fmt: skip


@pytest.fixture(scope="module")
def results(cluster, tmp_path_factory) -> dict[str, Result]:
    base = tmp_path_factory.mktemp("ray-jobs")

    def env_of(name: str) -> dict[str, str]:
        on_cluster = JOBS[name][2]
        return _ray_env(**({"RAY_ADDRESS": cluster.address} if on_cluster else {}))

    yield run_json_jobs(
        {name: functools.partial(_command, name) for name in JOBS}, base,
        parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S, env=env_of, result=Result,
    )  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)


# Ray Train's detached actors (`lifetime="detached"`), made with the job's runtime environment:
# on a cluster that outlives the job they are the cluster's, not the job's, and ddpdoctor leaves
# them to Ray (launch/reaper.py). The AutoscalingCoordinator, made by the first job that trains on
# a cluster, serves every later one until the cluster stops. A run's PlacementGroupCleaner
# outlives a controller that died (the stalled job's) to remove its placement group, and exits
# once it sees the controller dead through Ray's state API, which this module's cluster runs
# without (no dashboard): here it stays until the cluster stops.
RAY_CLUSTER_ACTORS = frozenset({"ray::_AutoscalingCoordinatorActor", "ray::PlacementGroupCleaner"})
LEFT_WAIT_S = 60


def _name(proc: psutil.Process) -> str:
    """Its name, without the method a Ray actor is running ("ray::Actor.method" -> "ray::Actor")."""
    try:
        return proc.name().split(".", 1)[0]
    except psutil.Error:  # ended since it was listed
        return ""


def _left_by_the_job(run_dir: Path) -> list[str]:
    return [_described(p) for p in job_processes(run_dir) if _name(p) not in RAY_CLUSTER_ACTORS]


def _nothing_left_by_the_job(run_dir: Path) -> list[str]:
    """The job's processes once they have ended ([] then), or those still running after
    LEFT_WAIT_S. On a running cluster the job's workers are the raylet's, and Ray ends them
    itself once the job's driver is gone (launch/reaper.py leaves them to it): moments after
    ddpdoctor has exited, not before."""
    deadline = time.monotonic() + LEFT_WAIT_S
    while (left := _left_by_the_job(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def _described(proc: psutil.Process) -> str:
    """A leftover process as a failure should show it: what it runs, its parent, its age."""
    try:
        with proc.oneshot():
            cmdline = " ".join(proc.cmdline())[:300]
            parent = proc.ppid()
            age = time.time() - proc.create_time()
            status = proc.status()
        return f"pid {proc.pid} ({status}, {age:.0f} s old, parent {parent}): {cmdline}"
    except psutil.Error as exc:
        return f"pid {proc.pid}: {type(exc).__name__}"


def _warnings(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] in ("warning", "error")]


@pytest.mark.parametrize("name", ["train-healthy-running", "actors-healthy-local"])
def test_a_healthy_ray_job_is_healthy_with_its_steps_counted(results, name):
    r = results[name]
    doc = r.document()
    assert r.returncode == 0, r.context()
    assert doc["verdict"] == "healthy", r.context()
    assert _warnings(doc) == [], r.context()
    assert doc["job"]["stopped_for"] is None
    assert sorted(rank["step"] for rank in doc["ranks"]) == [STEPS, STEPS], r.context()
    for rank in (0, 1):
        assert [s["step"] for s in r.events(rank, "step")] == list(range(1, STEPS + 1))
    assert _nothing_left_by_the_job(r.run_dir) == []


def test_ranks_are_known_by_their_process_group_and_ray_names(results):
    """The workers of the running cluster were reached through the runtime-env hook alone; each
    rank's hello names its Ray actor and its host and pid."""
    for name, actor in (
        ("train-healthy-running", "RayTrainWorker"),
        ("actors-healthy-local", None),
    ):
        r = results[name]
        for rank in (0, 1):
            hello = r.events(rank, "hello")[-1]
            assert hello["world_size"] == 2 and hello["pid"] > 0 and hello["host"]
            ray = hello["ray"]
            assert ray["job_id"] and ray["node_id"] and ray["actor_id"]
            if actor:
                assert ray["actor_class"] == actor
            else:
                assert ray["actor_name"] == f"trainer-{rank}"
            calls = [(c["state"], c["call"]) for c in r.events(rank, "ray_call")]
            assert calls and calls[-1][0] == "idle"


def test_a_rank_stalled_in_the_training_function_is_a_hang_named_at_its_line(results, cluster):
    r = results["train-stall-running"]
    doc = r.document()
    assert r.returncode == 1, r.context()
    assert doc["verdict"] == "hang", r.context()
    assert doc["culprits"] == [1], r.context()
    text = json.dumps(doc)
    assert "ray_train.py:43" in text, r.context()  # the planted sleep, in the training thread
    assert _nothing_left_by_the_job(r.run_dir) == []  # the job's workers ended on the cluster ...
    assert cluster.head.poll() is None  # ... and the cluster itself was left running
    assert _marked(cluster.mark), "the running cluster was stopped"


def test_the_clusters_own_actor_outlives_the_job_that_made_it(results):
    """Ray Train's AutoscalingCoordinator (detached, restarted by Ray whenever it dies) carries
    the environment of the job that made it on the running cluster, ddpdoctor's marker
    included. ddpdoctor leaves it to Ray (launch/reaper.py): killed at that job's end it would
    come back at once, as a new process, with the job's environment again."""
    made = [
        (name, proc)
        for name in ("train-healthy-running", "train-stall-running")
        for proc in job_processes(results[name].run_dir)
        if _name(proc) == "ray::_AutoscalingCoordinatorActor"
    ]
    assert len(made) <= 1, made  # one for the cluster
    for name, proc in made:
        ended = (results[name].run_dir.parent / "stdout").stat().st_mtime  # its final JSON
        assert proc.create_time() < ended, f"{_described(proc)} was started after {name} ended"


def test_a_worker_killed_mid_run_is_the_first_death_and_the_others_its_consequences(results):
    r = results["train-sigkill-local"]
    doc = r.document()
    assert r.returncode == 1, r.context()
    assert doc["verdict"] == "crash", r.context()
    assert doc["culprits"] == [1], r.context()
    ranks = {rank["rank"]: rank for rank in doc["ranks"]}
    assert ranks[1]["step"] == 5, r.context()  # it had done 5 steps when it was killed
    assert job_processes(r.run_dir) == []
