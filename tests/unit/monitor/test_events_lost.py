"""True endings without the run directory: while the ranks' events cannot be written (a full
file system), a rank's process gone without an exit event ended as far as ddpdoctor knows, and
how its launcher's exit status says; a record gone quiet is no hang. The disk is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, run_env, train

KW = {"capture_stacks": False, "explain_logs": False, "write_diagnosis": False}
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(mount: Path) -> None:
    with open(mount / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"x" * 65536)
                fh.flush()
        except OSError:
            pass


def _run(mount: Path, clock: Clock, rank1_pid: int) -> tuple[RunDir, Writer]:
    run = RunDir.create(mount / "run")
    run.run_json.write_text(json.dumps({"world_size": 2, "backend": "gloo"}))
    w = Writer(run, clock, host=this_host())
    w.start(pids=[os.getpid(), rank1_pid])
    train(w, clock, 3)
    return run, w


def test_a_rank_gone_while_the_disk_is_full_ended_and_its_launcher_says_how(small_fs):
    clock = Clock(time.time())
    with subprocess.Popen(SLEEPER, env=run_env(small_fs / "run")) as rank1:
        try:
            run, _w = _run(small_fs, clock, rank1.pid)
            monitor = Monitor(run, clock=clock, hang_after=5.0, **KW)
            assert monitor.poll().verdict is Verdict.RUNNING
            fill(small_fs)  # its exit event can no longer be written
            rank1.kill()
            rank1.wait()
            snap = monitor.poll()
            assert snap.ranks[1].state is RankState.DONE and snap.verdict is Verdict.RUNNING
            (disk,) = [f for f in snap.findings if f.id == "run.disk_full"]
            assert "launcher's exit status" in disk.summary
            clock.t += 60.0  # rank 0's record is silent now too: no hang for it
            snap = monitor.poll()
            assert snap.ranks[0].state is RankState.RUNNING and not snap.culprits
            ended = monitor.close(job_ended=True, job_exit=0, launcher="torchrun")
            assert ended.verdict is not Verdict.CRASH, ended.findings
        finally:
            rank1.kill()


def test_the_launchers_failure_is_the_verdict_and_the_disk_the_reason(small_fs):
    clock = Clock(time.time())
    with subprocess.Popen(SLEEPER, env=run_env(small_fs / "run")) as rank1:
        try:
            run, _w = _run(small_fs, clock, rank1.pid)
            monitor = Monitor(run, clock=clock, **KW)
            monitor.poll()
            fill(small_fs)
            rank1.kill()
            rank1.wait()
            monitor.poll()
            ended = monitor.close(job_ended=True, job_exit=1, launcher="torchrun")
        finally:
            rank1.kill()
    assert ended.verdict is Verdict.CRASH and not ended.culprits
    (failed,) = [f for f in ended.findings if f.id == "run.launcher_failed"]
    assert "torchrun" in failed.summary and "run.disk_full" in failed.summary
    assert "every rank recorded a clean exit" not in failed.summary
