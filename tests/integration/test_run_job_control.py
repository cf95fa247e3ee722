"""The TorchrunProcess with real processes standing in for torchrun: output routing, stopping a worker that
ignores SIGTERM, orphans, forwarded Ctrl-C, and a launcher killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ddpdoctor.launch.torchrun_process import TorchrunProcess
from tests.procs import PYTHON, REPO, clean_env, kill_group, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# A stand-in for torchrun: prints its own lines and a rank line, starts a "worker" in a session of
# its own (as torchrun does) that ignores SIGTERM, reports the worker's pid, and waits.
AGENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    mode = sys.argv[1]
    if mode == "print":
        print("agent line", flush=True)
        # a rank's output goes to its --log-dir file, as with torchrun --redirects 3
        rank_dir = os.path.join(sys.argv[2], "rdzv", "attempt_0", "0")
        os.makedirs(rank_dir)
        with open(os.path.join(rank_dir, "stdout.log"), "w") as fh:
            fh.write("rank line\\n")
        sys.exit(0)
    if mode == "sigint":
        def on_int(signum, frame):
            print("agent got SIGINT", flush=True)
            sys.exit(130)
        signal.signal(signal.SIGINT, on_int)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        start_new_session=True,
    )
    print(f"worker {worker.pid}", flush=True)
    time.sleep(600)
    """
)


def start_job(tmp_path: Path, mode: str) -> tuple[TorchrunProcess, list[str]]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    lines: list[str] = []
    log_dir = tmp_path / "logs" / "vm"
    job = TorchrunProcess(
        [PYTHON, str(script), mode, str(log_dir)],
        clean_env(),
        agent_log=log_dir / "torchrun.log",
        on_line=lines.append,
        log_dir=log_dir,
        run_root=tmp_path,
    )
    job.start()
    return job, lines


def worker_pid(lines: list[str]) -> int:
    found = wait_for(
        lambda: [int(line.split()[1]) for line in lines if line.startswith("worker ")],
        timeout=20,
        what="the worker's pid",
    )
    return found[0]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_output_goes_to_the_view_and_torchruns_own_lines_to_its_log(tmp_path):
    job, lines = start_job(tmp_path, "print")
    assert job.wait(timeout=20) == 0
    job.wait_output(timeout=10)
    assert sorted(lines) == ["[default0]:rank line", "agent line"]
    # torchrun's own output went straight to its log, not through the launcher
    assert (tmp_path / "logs" / "vm" / "torchrun.log").read_text() == "agent line\n"
    job.kill()


def test_stop_ends_torchrun_and_a_worker_that_ignores_sigterm(tmp_path):
    job, lines = start_job(tmp_path, "worker")
    worker = worker_pid(lines)
    job.refresh()
    assert worker in job.alive_pids() and job.pid in job.alive_pids()
    job.stop()
    assert job.stop_requested
    wait_for(lambda: gone(worker) and job.returncode() is not None, timeout=30, what="the stop")
    assert job.returncode() is not None
    job.kill()


def test_kill_reaches_a_worker_orphaned_by_torchruns_death(tmp_path):
    job, lines = start_job(tmp_path, "worker")
    worker = worker_pid(lines)
    job.refresh()  # the worker is known from here on, even after its parent dies
    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=10)
    assert not gone(worker)
    job.kill()
    wait_for(lambda: gone(worker), timeout=10, what="the orphaned worker to die")


def test_ctrl_c_is_forwarded_to_torchrun(tmp_path):
    job, lines = start_job(tmp_path, "sigint")
    wait_for(lambda: "ready" in lines, timeout=20, what="the agent")
    job.interrupt(signal.SIGINT)
    assert job.wait(timeout=20) == 130
    job.wait_output(timeout=10)
    assert "agent got SIGINT" in lines
    job.kill()


LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ddpdoctor.launch.torchrun_process import TorchrunProcess
    marker = Path(sys.argv[1])
    agent = (
        "import signal, sys, time\\n"
        "from pathlib import Path\\n"
        "def on_term(signum, frame):\\n"
        f"    Path({str(marker)!r}).write_text('sigterm')\\n"
        "    sys.exit(0)\\n"
        "signal.signal(signal.SIGTERM, on_term)\\n"
        "print('agent up', flush=True)\\n"
        "time.sleep(600)\\n"
    )
    job = TorchrunProcess([sys.executable, "-c", agent], {}, agent_log=marker.parent / "torchrun.log",
              on_line=lambda line: print(line, flush=True))
    job.start()
    print(f"agent pid {job.pid}", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_torchrun_is_told_to_stop_when_the_launcher_is_killed(tmp_path):
    marker = tmp_path / "marker"
    launcher = subprocess.Popen(
        [PYTHON, "-c", LAUNCHER, str(marker)],
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    agent_pid = None
    try:
        assert launcher.stdout is not None
        first = {launcher.stdout.readline().strip(), launcher.stdout.readline().strip()}
        agent_pid = int(next(line for line in first if line.startswith("agent pid")).split()[-1])
        assert "agent up" in first
        launcher.kill()  # SIGKILL: no atexit, no finally
        wait_for(marker.exists, timeout=20, what="the agent's SIGTERM (PR_SET_PDEATHSIG)")
        assert marker.read_text() == "sigterm"
    finally:
        kill_group(launcher)
        if agent_pid is not None and not gone(agent_pid):
            os.killpg(agent_pid, signal.SIGKILL)
