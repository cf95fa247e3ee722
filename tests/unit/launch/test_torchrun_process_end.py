"""TorchrunProcess.kill ends the job's processes as the monitor tells an end: the final
diagnosis follows at once and must see every rank gone, not waiting."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil

from ddpdoctor.launch.torchrun_process import TorchrunProcess
from ddpdoctor.monitor.follow.liveness import pid_alive
from tests.runtime_helpers import wait_until

# The main thread leaves (pthread_exit) while another thread goes on: the thread group leader
# shows as a zombie, and the process still runs (and could still write a rank's events).
_LEADER_LEAVES = r"""
import ctypes, threading, time
threading.Thread(target=lambda: time.sleep(600)).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def _leader_left(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() > 1
    except psutil.Error:
        return False


def test_kill_ends_a_process_whose_main_thread_left_before_it_returns(tmp_path: Path) -> None:
    job = TorchrunProcess(
        [sys.executable, "-c", _LEADER_LEAVES], {}, agent_log=tmp_path / "logs" / "torchrun.log"
    )
    job.start()
    pid = job.pid
    assert pid is not None
    try:
        wait_until(lambda: _leader_left(pid), timeout=20.0)  # its main thread left
        assert pid_alive(pid), "the monitor counts such a process alive"
        assert job.alive_pids() == [pid], "and so does the launcher"
        job.kill()
        assert not pid_alive(pid), "killed and ended by the time kill() returns"
        assert job.returncode() == -9
    finally:
        job.kill(wait=False)
        job.wait_output(5)
