"""Each launcher's stop protocol (launch/stop_protocol.py): srun gets two SIGINTs for a Ctrl-C and
is never SIGKILLed while it may still end its step (that leaks its Slurm allocation)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ddpdoctor.launch import stop_protocol
from ddpdoctor.launch.reaper import ENV_LAUNCH_ID, end_marked, new_launch_id
from tests.procs import clean_env, kill_group

pytestmark = pytest.mark.timeout(60)

# Counts SIGINTs and ignores SIGTERM, as a launcher busy ending its step would.
COUNTER = (
    "import signal, sys, time\n"
    "n = [0]\n"
    "def on_int(*_):\n"
    "    n[0] += 1\n"
    "    print(n[0], flush=True)\n"
    "signal.signal(signal.SIGINT, on_int)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def fake_srun(tmp_path, env=None) -> subprocess.Popen:
    """A Python named srun (the kernel's comm is the name it was started by)."""
    link = tmp_path / "srun"
    if not link.exists():
        link.symlink_to(sys.executable)
    proc = subprocess.Popen(
        [str(link), "-c", COUNTER],
        stdout=subprocess.PIPE,
        text=True,
        env=env or clean_env(),
        start_new_session=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_ctrl_c_passed_on_to_srun_is_two_sigints(tmp_path):
    proc = fake_srun(tmp_path)
    try:
        assert stop_protocol.is_srun(proc.pid)
        stop_protocol.pass_on(proc.pid, signal.SIGINT, srun=True)
        assert [proc.stdout.readline(), proc.stdout.readline()] == ["1\n", "2\n"]
    finally:
        kill_group(proc)


def test_srun_is_spared_sigkill_until_it_had_time_to_end_its_step(tmp_path, monkeypatch):
    monkeypatch.setattr(stop_protocol, "SRUN_EXIT_WAIT_S", 1.5)
    launch_id = new_launch_id()
    proc = fake_srun(tmp_path, clean_env({ENV_LAUNCH_ID: launch_id}))
    try:
        start = time.monotonic()
        assert end_marked(launch_id, grace_s=0.3) == 1
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert time.monotonic() - start >= 0.3 + 1.5  # SIGTERM, the grace, then srun's wait
    finally:
        kill_group(proc)


def test_the_steps_to_cancel_are_the_tasks_never_ddpdoctors_own(tmp_path):
    task = clean_env({"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0"})
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
        for env in (task, clean_env({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3"}))
    ]
    try:
        pids = [p.pid for p in procs]
        own = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3"}
        assert stop_protocol.slurm_steps(pids, own=own) == {"41.0"}
    finally:
        for p in procs:
            p.kill()
            p.wait()
