"""The running job: torchrun and every process it starts, from launch to the last kill.

torchrun runs in its own session (its own process group), so the terminal's Ctrl-C reaches only the
launcher, which forwards it. torchrun in turn starts each worker in a session of its own, so a
signal to torchrun's group does not reach the ranks: the TorchrunProcess therefore remembers every process of
the job it has seen (torchrun's descendants, and the rank pids the monitor reports) and signals each
one's group itself. Nothing of the job outlives the launcher: `kill()` runs on every way out,
normal, exception or atexit, and torchrun is told by the kernel (PR_SET_PDEATHSIG) to stop its
workers should the launcher itself be killed; a reaper process (reaper.py) ends whatever carries
the launch's marker after that, daemons of the ranks included.

torchrun's output goes straight to torchrun.log and the ranks' to their --log-dir files: none of it
passes through the launcher, so a launcher that dies (or whose own stdout is a closed pipe) neither
loses it nor blocks the job on a full pipe. An OutputTail reads the files back for display.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from ddpdoctor.launch.output_tail import OutputTail
from ddpdoctor.launch.stop_protocol import is_srun
from ddpdoctor.launchers.proc_tree import descendants
from ddpdoctor.protocol.rundir import make_private_dirs, open_private

STOP_GRACE_S = 3.0  # SIGTERM first; whatever still runs after this long gets SIGKILL
KILL_WAIT_S = 5.0  # how long kill() waits for the killed processes to end
# torchrun's prefix on the ranks' tee'd output: "[default0]:" (role "default", local rank).
RANK_LINE = re.compile(r"^\[default\d+\]:")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux), so torchrun, which
    handles SIGTERM by stopping its workers, never outlives a launcher killed with SIGKILL."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


class TorchrunProcess:
    """torchrun and its workers. `returncode()` and `stop()` are what the TUI relies on."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        agent_log: Path,
        on_line: Callable[[str], None] | None = None,
        on_agent_line: Callable[[str], None] | None = None,
        cwd: str | None = None,
        log_dir: Path | None = None,
        run_root: Path | None = None,
    ) -> None:
        """`log_dir`: torchrun's --log-dir, whose rank logs are shown through `on_line`;
        `run_root`: the run directory it lies in."""
        self.argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._agent_log = agent_log
        self._on_line = on_line
        self._on_agent_line = on_agent_line
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir = log_dir if log_dir is not None else agent_log.parent
        self._run_root = run_root if run_root is not None else self._log_dir.parent.parent
        self._tail: OutputTail | None = None
        self._lock = threading.Lock()
        self._known: dict[int, psutil.Process] = {}
        self._stop_requested = False
        self._interrupts = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        make_private_dirs(self._agent_log.parent)
        fd = open_private(self._agent_log)
        try:
            start_offset = os.fstat(fd).st_size
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            os.close(fd)
        atexit.register(self.kill)
        self._remember(self._proc.pid)
        self._tail = OutputTail(
            self._agent_log,
            self._log_dir,
            self._run_root,
            start_offset=start_offset,
            on_line=self._on_line,
            on_agent_line=self._on_agent_line,
        )
        self._tail.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def returncode(self) -> int | None:
        """None while torchrun runs; its exit status once it has ended."""
        return self._proc.poll() if self._proc else None

    def wait(self, timeout: float | None = None) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_output(self, timeout: float) -> None:
        """Once torchrun has exited: read its last lines (and the ranks') and stop following."""
        if self._tail is not None:
            self._tail.stop(timeout)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    # -- the processes of the job ---------------------------------------------------------------

    def track(self, pids: Iterable[int | None]) -> None:
        """Remember more processes of the job (the ranks' pids from their hello events)."""
        for pid in pids:
            if pid:
                self._remember(pid)

    def refresh(self) -> None:
        """Remember torchrun's current descendants, so they are known even if torchrun dies first."""
        if self._proc is None:
            return
        for pid in descendants(self._proc.pid):
            self._remember(pid)

    def alive_pids(self) -> list[int]:
        self.refresh()
        with self._lock:
            return [pid for pid, proc in self._known.items() if _running(proc)]

    def _remember(self, pid: int) -> None:
        with self._lock:
            if pid in self._known:
                return
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            return
        with self._lock:
            self._known.setdefault(pid, proc)

    # -- stopping -----------------------------------------------------------------------------

    def interrupt(self, signum: int) -> None:
        """Ctrl-C or SIGTERM to the launcher: pass it on to torchrun, which stops its workers;
        escalate to SIGKILL if that takes too long, or at once on a second interrupt."""
        self._interrupts += 1
        self._stop_requested = True
        if self._interrupts > 1:
            self.kill(wait=False)
            return
        self.refresh()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._proc.pid, signum)
        self._escalate([(STOP_GRACE_S * 2, lambda: self.kill(wait=False))])

    def stop(self) -> None:
        """End the job; returns at once (`wait()` blocks until torchrun has gone).

        The workers get SIGTERM first, so torchrun sees them end, stops the rest and reports
        them in its usual failure table; torchrun itself gets SIGTERM only if it lingers, and
        whatever still runs after that gets SIGKILL.
        """
        self._stop_requested = True
        self.refresh()
        if self._workers() and self.returncode() is None:
            self._signal_all(signal.SIGTERM, include_agent=False)
            steps = [
                (STOP_GRACE_S, lambda: self._signal_all(signal.SIGTERM)),
                (STOP_GRACE_S, lambda: self.kill(wait=False)),
            ]
        else:
            self._signal_all(signal.SIGTERM)
            steps = [(STOP_GRACE_S, lambda: self.kill(wait=False))]
        self._escalate(steps)

    def kill(self, wait: bool = True) -> None:
        """SIGKILL everything of the job that still runs (idempotent; runs at exit too)."""
        self._signal_all(signal.SIGKILL)
        if wait and self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            with self._lock:
                procs = list(self._known.values())
            # Until each process has ended as the monitor tells an end (liveness.pid_alive): the
            # final diagnosis follows at once, and a rank still tearing down would read as alive
            # there (waiting, not gone). Polled: a zombie nobody reaps never "ends" for psutil.
            deadline = time.monotonic() + KILL_WAIT_S
            while any(_running(p) for p in procs) and time.monotonic() < deadline:
                time.sleep(0.02)

    def _workers(self) -> list[psutil.Process]:
        agent = self.pid
        with self._lock:
            return [p for pid, p in self._known.items() if pid != agent and _running(p)]

    def _escalate(self, steps: list[tuple[float, Callable[[], None]]]) -> None:
        """Run each step after its delay, unless every process of the job has ended by then."""

        def escalate() -> None:
            for delay, action in steps:
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline:
                    if not self.alive_pids():
                        return
                    time.sleep(0.1)
                action()

        threading.Thread(target=escalate, name="job-stop", daemon=True).start()

    def _signal_all(self, signum: int, *, include_agent: bool = True) -> None:
        self.refresh()
        with self._lock:
            procs = list(self._known.values())
        for proc in procs:
            if not _running(proc) or (not include_agent and proc.pid == self.pid):
                continue
            if signum == signal.SIGKILL and is_srun(proc.pid):
                continue  # SIGKILL leaks srun's allocation: it ends with its tasks (end_marked)
            # Each worker leads its own group (its DataLoader workers are in it): signal the group.
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                if os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signum)
                else:
                    proc.send_signal(signum)


def _running(proc: psutil.Process) -> bool:
    """Alive (is_running also guards against a reused pid). A zombie runs while its thread
    group's other threads do: a process being killed shows so for a few hundred milliseconds
    (its main thread gone, the others still tearing down), and a main thread that left with
    pthread_exit leaves a process that still runs. The monitor tells an end the same way."""
    try:
        if not proc.is_running():
            return False
        return proc.status() != psutil.STATUS_ZOMBIE or proc.num_threads() > 1
    except psutil.Error:
        return False
