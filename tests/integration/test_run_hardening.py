"""Issue 15's probes of `run`, `watch` and `explain`, for real: ddpdoctor's own output never in the
job's path, nothing of the job outliving `run`, torchrun's output on disk, used run directories
and impossible --nproc refused, runs that never started or were interrupted reported as such."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.procs import (
    REPO,
    background,
    clean_env,
    ddpdoctor_cmd,
    job_processes,
    kill_group,
    run,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def diagnosis(run_dir: Path) -> dict:
    return json.loads((run_dir / "diagnosis.json").read_text())


def run_with_stdout(cmd: list[str], stdout, *, timeout: float) -> int:
    """Run with stdout going where the probe sends it; stderr to a pipe we read."""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, cwd=REPO,
        env=clean_env(), start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_closed_stdout_never_stops_the_job(shared_runs):
    # `ddpdoctor run | head -1`: the reader is gone before the doctor prints its first line.
    # conftest's "closed-stdout" run: the reference job, --steps 10, with the preflight doctor.
    result = shared_runs["closed-stdout"]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.explain()
    final = diagnosis(result.run_dir)
    assert final["verdict"] == "healthy" and final["final"] is True
    assert [r["state"] for r in final["ranks"]] == ["done", "done"]


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_full_disk_on_stdout_never_stops_the_job(shared_runs):
    # conftest's "full-stdout" run: the reference job, --steps 10, stdout on /dev/full
    result = shared_runs["full-stdout"]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.explain()
    assert diagnosis(result.run_dir)["verdict"] == "healthy"


def test_impossible_nproc_and_a_used_run_directory_are_refused_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    too_many = run(
        ddpdoctor_cmd("run", "--no-tui", "--nproc", "100000", "--run-dir", str(run_dir)),
        timeout=60,
    )
    assert too_many.returncode == 2 and too_many.stdout == ""
    assert too_many.stderr.startswith("ddpdoctor: error: --nproc 100000 is more ranks than")
    assert "usable CPU cores" in too_many.stderr and not run_dir.exists()
    run_dir.mkdir()
    (run_dir / "diagnosis.json").write_text('{"verdict": "crash"}')
    reused = run(
        ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--run-dir", str(run_dir)), timeout=60
    )
    assert reused.returncode == 2 and reused.stderr.count("\n") == 1
    assert f"run directory {run_dir} is not empty" in reused.stderr
    assert "choose a new --run-dir" in reused.stderr


DAEMON = textwrap.dedent(
    """
    import os, sys, time
    pid_file = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: no parent of the job's left, its own session
            with open(pid_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.rename(pid_file + ".tmp", pid_file)
            time.sleep(600)
            os._exit(0)
        os._exit(0)
    while not os.path.exists(pid_file):
        time.sleep(0.05)
    print("started a daemon", flush=True)
    """
)


def test_a_daemon_a_rank_started_ends_with_the_run(tmp_path):
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    pid_file = tmp_path / "daemon.pid"
    run_dir = tmp_path / "run"
    result = run(
        ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--nproc", "1", "--run-dir",
                      str(run_dir), "--", str(script), str(pid_file)),
        timeout=120,
        cwd=REPO,
    )  # fmt: skip
    daemon = int(pid_file.read_text())
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == "zombie"
        assert job_processes(run_dir) == []
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


STUBBORN = textwrap.dedent(
    """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("stubborn rank ready", flush=True)
    time.sleep(600)
    """
)


def test_sigkill_to_ddpdoctor_ends_every_process_of_the_job_and_keeps_torchruns_output(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--nproc", "2", "--run-dir",
                        str(run_dir), "--", str(script))  # fmt: skip
    with background(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        wait_for(
            lambda: (
                len(list(run_dir.glob("logs/*/*/attempt_0/*/stdout.log"))) == 2
                and all(
                    "ready" in p.read_text()
                    for p in run_dir.glob("logs/*/*/attempt_0/*/stdout.log")
                )
            ),
            timeout=90,
            what="both ranks to start",
        )
        assert len(job_processes(run_dir)) >= 3  # torchrun and two ranks
        proc.kill()  # SIGKILL to ddpdoctor only
        killed_t = time.monotonic()
        wait_for(lambda: job_processes(run_dir) == [], timeout=20, what="the job to end")
        # torchrun's grace for ranks that ignore SIGTERM is 30 s: the reaper does not wait for it
        assert time.monotonic() - killed_t < 15
    # torchrun wrote its own last words straight to its log, with ddpdoctor gone
    log = next(run_dir.glob("logs/*/torchrun.log")).read_text()
    assert "SIGTERM" in log or "Signals.SIGTERM" in log, log[-2000:]


def test_ctrl_c_on_a_healthy_run_is_interrupted_not_a_crash(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--nproc", "2", "--steps", "100000",
                        "--run-dir", str(run_dir))  # fmt: skip
    with background(cmd, cwd=REPO) as proc:
        wait_for(
            lambda: any(
                '"kind":"step"' in p.read_text() for p in run_dir.glob("events/rank-*.jsonl")
            ),
            timeout=120,
            what="training steps",
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "verdict: interrupted (exit code 130)" in out
    final = diagnosis(run_dir)
    assert final["verdict"] == "interrupted" and final["culprits"] == []


def test_watch_ends_on_a_run_that_never_started(tmp_path):
    run_dir = tmp_path / "run"
    launched = run(
        ddpdoctor_cmd("run", "--no-tui", "--backend", "nccl", "--nproc", "1", "--run-dir",
                      str(run_dir)),
        timeout=120,
        env=clean_env({"CUDA_VISIBLE_DEVICES": ""}),
    )  # fmt: skip
    assert launched.returncode == 1
    assert "verdict: not started (exit code 1)" in launched.stdout
    assert diagnosis(run_dir)["verdict"] == "not_started"
    watched = run(ddpdoctor_cmd("watch", "--no-tui", str(run_dir)), timeout=30)
    assert watched.returncode == 1
    assert "NOT STARTED" in watched.stdout  # its findings: the checks that refused the launch
    assert "preflight.gpu.count: the preflight refused the launch: " in watched.stdout
    as_json = run(ddpdoctor_cmd("watch", "--json", str(run_dir)), timeout=30)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["verdict"] == "not_started"


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_watch_into_a_closed_pipe_ends_quietly_with_the_verdicts_code(tmp_path, shared_runs):
    launched = shared_runs["reference-healthy"]  # a finished healthy run of the reference job
    assert launched.returncode == 0, launched.explain()
    run_dir = tmp_path / "run"
    shutil.copytree(launched.run_dir, run_dir)  # a copy: watch must not touch the shared run
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        code = run_with_stdout(ddpdoctor_cmd("watch", "--no-tui", str(run_dir)), write_end,
                               timeout=30)  # fmt: skip
    finally:
        os.close(write_end)
    assert code == 0


def test_explain_refuses_a_fifo_and_a_device_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero")):
        result = run(ddpdoctor_cmd("explain", str(target)), timeout=30)
        assert result.returncode == 2
        assert result.stderr == f"ddpdoctor: error: cannot read {target}: not a regular file " \
            "(explain reads log files)\n"  # fmt: skip


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_world_size_no_launch_can_fill_is_diagnosed_and_stopped(shared_runs):
    # conftest's WORLD_OF_THREE: init_process_group("gloo", world_size=3) under 2 ranks
    result = shared_runs["world-size-3"]
    run_dir = result.run_dir
    assert result.returncode == 1, result.stdout[-3000:]
    assert "verdict: mismatch (exit code 1)" in result.stdout
    final = diagnosis(run_dir)
    assert final["verdict"] == "mismatch"
    first = final["findings"][0]
    assert first["id"] == "init.world_size_mismatch"
    assert "world_size=3 but 2 ranks launched" in first["summary"]
    assert job_processes(run_dir) == []
