"""How each launcher is asked to stop, and what it must never get.

Most launchers stop on the signal they are sent: torchrun and an mp.spawn parent on SIGINT or
SIGTERM (they pass it to their ranks), and SIGKILL ends what lingers. srun is different:

- one SIGINT is only a status request ("srun: interrupt (one more within 1 sec to abort)"); two
  within a second abort the step (its tasks get SIGINT, then SIGCONT, SIGTERM and SIGKILL), so a
  Ctrl-C passed on to srun is sent as two SIGINTs. SIGTERM makes srun force the step's
  termination itself ("srun: forcing job termination").
- SIGKILL to srun leaks its allocation: srun never tells the controller, so the job stays
  RUNNING with no processes and blocks the next srun. srun is therefore never sent SIGKILL while
  it may still end its step: once its tasks are gone it exits by itself; if it has not within
  SRUN_EXIT_WAIT_S, its steps are cancelled with `scancel JOB.STEP` (the step ids read from its
  tasks' environment), and only then is it killed.

Only the standard library: the job guard and the reaper use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable

SRUN = "srun"
DOUBLE_SIGINT_GAP_S = 0.2  # srun aborts on a second SIGINT within one second
SRUN_EXIT_WAIT_S = 15.0  # srun waits for its step's end (Slurm's KillWait + 2 s here)
SCANCEL_WAIT_S = 10.0
SCANCEL_TIMEOUT_S = 10.0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def is_srun(pid: int) -> bool:
    return _comm(pid) == SRUN


def is_srun_command(argv: Iterable[str]) -> bool:
    words = list(argv)
    return bool(words) and os.path.basename(words[0]) == SRUN


def pass_on(pid: int, signum: int, *, srun: bool) -> None:
    """Pass a stop request (SIGINT, SIGTERM, SIGHUP) on to a launcher in the way it understands."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)
        if srun and signum == signal.SIGINT:
            time.sleep(DOUBLE_SIGINT_GAP_S)
            os.kill(pid, signal.SIGINT)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def slurm_steps(pids: Iterable[int], *, own: dict[str, str] | None = None) -> set[str]:
    """ "JOB.STEP" of the Slurm tasks among `pids` (from their environment), but never the step
    ddpdoctor itself runs in (`own`: ddpdoctor's environment)."""
    env = os.environ if own is None else own
    mine = f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"
    steps = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                fields = dict(
                    item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item
                )
        except OSError:
            continue
        job, step = fields.get(b"SLURM_JOB_ID"), fields.get(b"SLURM_STEP_ID")
        if job and step is not None:
            found = f"{job.decode(errors='replace')}.{step.decode(errors='replace')}"
            if found != mine:
                steps.add(found)
    return steps


def end_sruns(sruns: Iterable[int], steps: Iterable[str]) -> None:
    """The last step for srun processes that were spared SIGKILL: wait for them to exit, cancel
    their steps if they do not, and kill only what still runs after that. Bounded in time."""
    left = [pid for pid in sruns if _alive(pid)]
    if not left:
        return
    if _wait_gone(left, SRUN_EXIT_WAIT_S):
        return
    wanted = sorted(set(steps))
    scancel = shutil.which("scancel")
    if wanted and scancel:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [scancel, *wanted],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=SCANCEL_TIMEOUT_S,
                check=False,
            )
        if _wait_gone(left, SCANCEL_WAIT_S):
            return
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return not any(_alive(pid) for pid in pids)
