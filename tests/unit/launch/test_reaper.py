"""The reaper ends every process carrying the launch's marker, also when the launcher is gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ddpdoctor.launch.reaper import (
    ENV_LAUNCH_ID,
    Reaper,
    end_marked,
    job_pids,
    marked_pids,
    new_launch_id,
)
from ddpdoctor.protocol import processes
from tests.procs import clean_env, kill_group, wait_for

STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


@pytest.fixture
def marked():
    started: list[subprocess.Popen] = []

    def start(launch_id: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", STUBBORN],
            env=clean_env({ENV_LAUNCH_ID: launch_id}),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # as a setsid daemon: no group of the job's holds it
        )
        started.append(proc)
        assert proc.stdout.readline() == "ready\n"  # SIGTERM is ignored from here on
        return proc

    yield start
    for proc in started:  # they ignore SIGTERM: kill_group's SIGTERM alone would wait 5 s
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_group(proc)


def test_end_marked_ends_only_the_launchs_processes_even_those_ignoring_sigterm(marked):
    ours, other = new_launch_id(), new_launch_id()
    a, b, bystander = marked(ours), marked(ours), marked(other)
    wait_for(lambda: len(marked_pids(ours)) == 2, timeout=20, what="the marked processes")
    assert sorted(marked_pids(ours)) == sorted([a.pid, b.pid])
    assert end_marked(ours, grace_s=0.5) == 2
    assert a.wait(timeout=10) == -9 and b.wait(timeout=10) == -9
    assert bystander.poll() is None and marked_pids(other) == [bystander.pid]


def test_the_reaper_acts_when_its_launcher_dies(marked, tmp_path):
    launch_id = new_launch_id()
    # A stand-in launcher that starts the reaper, then is killed with SIGKILL.
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from ddpdoctor.launch.reaper import Reaper; "
         "r = Reaper(sys.argv[1], run_dir=sys.argv[2]); print(r.pid, flush=True); "
         "time.sleep(600)", launch_id, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=clean_env(), start_new_session=True,
    )  # fmt: skip
    try:
        reaper_pid = int(launcher.stdout.readline())
        job = marked(launch_id)
        wait_for(lambda: marked_pids(launch_id) == [job.pid], timeout=20, what="the job")
        time.sleep(0.5)
        assert job.poll() is None  # the reaper waits while its launcher lives
        launcher.kill()
        launcher.wait(timeout=10)
        assert job.wait(timeout=20) in (-9, -15)
        wait_for(lambda: not _running(reaper_pid), timeout=20, what="the reaper to exit")
        # it says in the run directory that it ended the job of a launcher that died
        assert processes.launcher_was_killed(tmp_path)
    finally:
        kill_group(launcher)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_closing_the_reaper_after_a_clean_end_leaves_nothing(marked):
    launch_id = new_launch_id()
    reaper = Reaper(launch_id)
    job = marked(launch_id)
    wait_for(lambda: marked_pids(launch_id), timeout=20, what="the job")
    reaper.close(timeout=20)
    assert job.poll() is not None and marked_pids(launch_id) == []


def test_a_launcher_that_ended_its_job_itself_leaves_no_note(marked, tmp_path):
    launch_id = new_launch_id()
    reaper = Reaper(launch_id, run_dir=str(tmp_path))
    job = marked(launch_id)
    wait_for(lambda: marked_pids(launch_id), timeout=20, what="the job")
    end_marked(launch_id)  # what the launcher does before it closes the reaper
    reaper.close(timeout=20)
    assert job.poll() is not None
    assert not processes.launcher_was_killed(tmp_path)


def test_the_reaper_of_a_nodes_launcher_says_so_in_its_node_record(marked, tmp_path):
    """A launcher of node 1 killed: its reaper ends node 1's part and records, in node 1's
    record, that its launcher was killed (the other nodes read it there)."""
    from ddpdoctor.protocol.node_records import (
        STOPPED_LAUNCHER_KILLED,
        NodeRecord,
        read_node_record,
        write_node_record,
    )
    from ddpdoctor.protocol.rundir import RunDir

    run = RunDir.create(tmp_path / "run")
    write_node_record(run, NodeRecord(1, "h2", 4242, torchrun_pid=4243, started_t=time.time()))
    launch_id = new_launch_id()
    reaper = Reaper(launch_id, run_dir=str(run.path), node_rank=1)
    job = marked(launch_id)
    wait_for(lambda: marked_pids(launch_id), timeout=20, what="the job")
    reaper.close(timeout=20)  # EOF while the job runs: as when its launcher dies
    assert job.poll() is not None
    record = read_node_record(run, 1)
    assert record is not None and record.stopped_for == STOPPED_LAUNCHER_KILLED and record.ended
    assert not processes.launcher_was_killed(run.path)  # the node's record says it, not the run's


def test_the_reaper_of_a_killed_launcher_removes_its_rank_socket():
    """A launcher killed with SIGKILL leaves its rank socket's directory in /tmp; its reaper,
    told of it, removes it once the job is ended."""
    from ddpdoctor.protocol.rank_socket import RankSocket

    sock = RankSocket.open()
    assert sock is not None
    directory = sock.directory
    try:
        reaper = Reaper(new_launch_id(), socket_dir=directory)
        reaper.close(timeout=20)  # EOF: as when its launcher dies
        assert not directory.exists()
    finally:
        sock.close()


# A stand-in raylet: a Python process named "raylet" (through a link of that name) that starts
# one worker with the environment it is given and prints the worker's pid.
RAYLET = (
    "import subprocess, sys, time, json; "
    "w = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=json.loads(sys.argv[2]), "
    "stdout=subprocess.PIPE, text=True); "
    "assert w.stdout.readline() == 'ready\\n'; print(w.pid, flush=True); time.sleep(600)"
)


@pytest.mark.parametrize("cluster", ["running", "local"])
def test_a_ray_worker_of_a_running_cluster_is_left_to_ray_one_of_the_jobs_cluster_is_not(
    tmp_path, cluster
):
    """A running cluster's raylet (`ray start`) carries no marker; the job's runtime_env gives
    its workers the marker all the same. They are Ray's to end: its detached actors are the
    cluster's, and Ray restarts one that is killed. A local cluster's raylet is the job's."""
    launch_id = new_launch_id()
    link = tmp_path / "raylet"
    link.symlink_to(sys.executable)
    worker_env = clean_env({ENV_LAUNCH_ID: launch_id})
    raylet_env = worker_env if cluster == "local" else clean_env()
    raylet = subprocess.Popen(
        [str(link), "-c", RAYLET, STUBBORN, json.dumps(worker_env)],
        env=raylet_env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        worker = int(raylet.stdout.readline())
        assert psutil.Process(raylet.pid).name() == "raylet"
        assert worker in marked_pids(launch_id)
        if cluster == "running":
            assert job_pids(launch_id) == []
            assert end_marked(launch_id, grace_s=0.3) == 0
            assert _running(worker)
        else:
            assert sorted(job_pids(launch_id)) == sorted([raylet.pid, worker])
            assert end_marked(launch_id, grace_s=0.3) == 2
            wait_for(lambda: not _running(worker), timeout=20, what="the worker to end")
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(raylet.pid, signal.SIGKILL)
        kill_group(raylet)
