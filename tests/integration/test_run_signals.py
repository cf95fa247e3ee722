"""The signal policy of `ddpdoctor run`, for each launch mode (docs/trust-and-signals.md).

SIGHUP (the terminal went away): the job runs on, ddpdoctor watches it to the end, writes
diagnosis.json and exits with the verdict's code. Ctrl-C under srun: the step is torn down and the
allocation released (srun gets two SIGINTs, never SIGKILL). The terminal here is a real pseudo-terminal,
ddpdoctor's controlling terminal, hung up by closing its master side, as a dropped ssh session
does."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import termios
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.test_run_commands import slurm
from tests.procs import (
    PYTHON,
    background,
    clean_env,
    ddpdoctor_cmd,
    job_processes,
    kill_group,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOBS = Path(__file__).resolve().parent.parent / "launch_jobs"
STEPS = 80


def _controlling_terminal() -> None:
    """In the child, after setsid: its stdin (the pty's slave) becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def drain(master: int, until: float) -> bytes:
    """Read what ddpdoctor wrote to its terminal (so it never blocks on a full pty) until then."""
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([master], [], [], max(0.0, min(0.2, until - time.monotonic())))
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
    return out


def steps_of(run_dir: Path, rank: int) -> list[int]:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("kind") == "step":
                steps.append(event["step"])
    return steps


# One launch mode is enough: the policy is the launcher's (launch/hangup.py), the same for every
# mode, and the job runs in a session of its own whichever launcher starts it.
JOB = ("--nproc", "2", "--", str(JOBS / "env_hang.py"))


def test_a_hangup_of_the_terminal_leaves_the_job_running_to_its_end(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--run-dir", str(run_dir), *JOB, "--steps", str(STEPS)
    )  # fmt: skip
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        cmd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=tmp_path,
        env=clean_env({"TERM": "xterm-256color"}),
        start_new_session=True,
        preexec_fn=_controlling_terminal,
    )
    os.close(slave)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(steps_of(run_dir, 1)) < 5:
            drain(master, time.monotonic() + 0.5)
            assert proc.poll() is None, "ddpdoctor ended before the job trained"
        assert len(steps_of(run_dir, 1)) >= 5, "the job never trained"
        os.close(master)  # the terminal hangs up: SIGHUP to ddpdoctor, its session's leader
        master = -1
        returncode = proc.wait(timeout=120)
    finally:
        if master >= 0:
            os.close(master)
        kill_group(proc)
        for left in job_processes(run_dir):  # never leak into the suite, even on failure
            with contextlib.suppress(Exception):
                left.kill()
    assert returncode == 0, f"ddpdoctor ended with {returncode}"
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    assert diagnosis["verdict"] == "healthy"
    assert [r["state"] for r in diagnosis["ranks"]] == ["done", "done"]
    assert steps_of(run_dir, 0)[-1] == steps_of(run_dir, 1)[-1] == STEPS  # every step ran


# -- srun (make cluster) ----------------------------------------------------------------------


def squeue_named(name: str) -> str:
    done = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, timeout=10
    )
    return done.stdout.strip()


@pytest.mark.slurm
@slurm
def test_ctrl_c_under_srun_ends_the_step_and_releases_the_allocation(tmp_path):
    """One SIGINT is only a status request to srun; ddpdoctor used to SIGKILL srun 6 s later,
    which left the job RUNNING with no processes, blocking the next srun."""
    name = f"ddpdoctor-ctrl-c-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--run-dir", str(run_dir), "--",
        "srun", "-J", name, "-n", "2", PYTHON, str(JOBS / "env_hang.py"), "--steps", "100000",
    )  # fmt: skip
    try:
        with background(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as p:
            wait_for(
                lambda: len(steps_of(run_dir, 1)) >= 2 or p.poll() is not None,
                timeout=120,
                what="the srun job to train",
            )
            assert p.poll() is None, p.stdout.read()
            assert squeue_named(name), "the job is not in squeue"
            os.kill(p.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 130, out
        left = wait_for(
            lambda: not squeue_named(name) or None, timeout=15, what="the allocation to go"
        )
        assert left
    finally:
        subprocess.run(["scancel", "-n", name], capture_output=True, timeout=10, check=False)
