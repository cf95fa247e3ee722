"""The guard between `ddpdoctor run` and a user's own command: nothing of the job outlives
ddpdoctor, even when ddpdoctor itself is killed.

    python -m ddpdoctor.launch.job_guard COMMAND ARGS...

ddpdoctor's own torchrun stops its workers when the kernel tells it that ddpdoctor died
(PR_SET_PDEATHSIG, then torchrun's SIGTERM handler). A user's command may not: an mp.spawn parent
dies of SIGTERM at once and leaves its ranks running, orphaned. So a command runs under this
guard, which ddpdoctor starts instead (same output, same exit status, signals passed on):

- it is a child subreaper (PR_SET_CHILD_SUBREAPER): a process of the job whose parent dies (the
  ranks of a dead mp.spawn parent) becomes its child, not init's, so it can still find them;
- it forwards SIGINT and SIGTERM from ddpdoctor to the command, in the command's own stop
  protocol (stop_protocol.py: srun gets two SIGINTs for a Ctrl-C, and never SIGKILL);
- when ddpdoctor dies (the parent-death signal, or its parent pid changes), or when the command
  has ended and left processes behind, it sends SIGTERM to every process below it, and SIGKILL
  to whatever still runs STOP_GRACE_S later;
- it exits as the command did: the same code, or dies of the same signal.

Only the standard library (and ddpdoctor's /proc walk, which needs no more): it starts before
anything else of the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from ddpdoctor.launch.reaper import ENV_LAUNCH_ID, marked_pids
from ddpdoctor.launch.stop_protocol import (
    end_sruns,
    is_srun,
    is_srun_command,
    pass_on,
    slurm_steps,
)
from ddpdoctor.launchers.proc_tree import descendants

STOP_GRACE_S = 3.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
USAGE = "usage: python -m ddpdoctor.launch.job_guard COMMAND [ARGS...]"


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def end_everything_below_me() -> None:
    """SIGTERM to every process below the guard, SIGKILL to what is left after the grace; srun
    is spared SIGKILL (it would leak its allocation) and ended by its own protocol instead."""
    me = os.getpid()
    pids = descendants(me)
    # srun's tasks run under slurmstepd, not below the guard: the launch's marker finds them.
    launch_id = os.environ.get(ENV_LAUNCH_ID)
    steps = slurm_steps([*pids, *(marked_pids(launch_id) if launch_id else ())])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while pids and time.monotonic() < deadline and descendants(me):
        _reap()
        time.sleep(0.1)
    sruns = []
    for pid in descendants(me):
        if is_srun(pid):
            sruns.append(pid)
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end_sruns(sruns, steps)
    _reap()


def _reap() -> None:
    """Collect the exit status of orphans reparented to the guard (no zombies left)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(f"ddpdoctor: error: {USAGE}\n")
        return 2
    parent = os.getppid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent or parent == 1:
        return 1  # ddpdoctor died before the guard was set up: start nothing
    srun = is_srun_command(argv)  # a Ctrl-C passed on to srun is two SIGINTs (stop_protocol)
    orphaned = threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if os.getppid() != parent:  # the parent-death signal: ddpdoctor is gone
            orphaned.set()
        elif started:
            pass_on(started[0].pid, signum, srun=srun)
        else:
            pending.append(signum)  # before the command started: passed on once it has

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        sys.stderr.write(f"ddpdoctor: error: cannot run {argv[0]}: {exc.strerror or exc}\n")
        return 127
    started.append(proc)
    for waiting in pending:
        pass_on(proc.pid, waiting, srun=srun)
    while proc.poll() is None and not orphaned.is_set():
        if os.getppid() != parent:
            orphaned.set()
            break
        time.sleep(0.2)
    # ddpdoctor is gone, or the command has ended: what still runs below the guard (ranks an
    # mp.spawn parent left behind) is ended now rather than left running without a watcher
    end_everything_below_me()
    if orphaned.is_set():
        return 1
    return exit_as(proc.returncode)


def exit_as(code: int) -> int:
    """End as the command did: return its exit code, or die of the signal that ended it.

    SIGKILL (the OOM killer) and SIGSTOP take no handler: `signal.signal` raises for them, which
    once turned the job's OOM kill into a traceback of the guard's and exit 1. Any signal is sent
    to the guard with its default action where that can be set, unblocked; should the guard
    survive it (a signal whose default action is not to end a process), it exits 128 + N, as a
    shell reports a death by signal N."""
    if code >= 0:
        return code
    signum = -code
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signum)
    return 128 + signum


def guarded_main(argv: list[str]) -> int:
    """`main`, with ddpdoctor's own failure kept out of the job's record: the guard's output is
    the job's (torchrun.log), where a traceback from this file would be read as an exception of
    the user's job. One line says it is ddpdoctor's, and the job is ended, not left behind."""
    try:
        return main(argv)
    except Exception as exc:  # noqa: BLE001 - reported as ddpdoctor's own, in one line
        sys.stderr.write(
            f"ddpdoctor: internal error in the job guard: {type(exc).__name__}: {exc}\n"
        )
        with contextlib.suppress(Exception):
            end_everything_below_me()
        return 3


if __name__ == "__main__":
    raise SystemExit(guarded_main(sys.argv[1:]))
