"""Nothing of a job outlives `ddpdoctor run`, not even when ddpdoctor is killed with SIGKILL.

Every process of the job carries the launch's marker in its environment (DDPDOCTOR_LAUNCH_ID,
read back from /proc/<pid>/environ, which a process cannot change after it started): torchrun, the
ranks, their DataLoader workers and any daemon a rank starts with a double fork and setsid, which
torchrun's own cleanup never sees.

Not a worker of a Ray cluster that was running before the job: it carries the marker too (the
job's runtime_env), but it is Ray's to end (`_left_to_ray`).

- `end_marked(id)` ends them all: SIGTERM, a grace period, SIGKILL; scanned again until none is
  left (a process may fork while it is being ended). The launcher calls it when the job is over.
- `Reaper` is a small process in a session of its own that waits on a pipe from the launcher.
  The pipe reaches end-of-file when the launcher exits, however it exits (SIGKILL included);
  the reaper then ends whatever still carries the marker, and exits itself.

    python -m ddpdoctor.launch.reaper LAUNCH_ID [RUN_DIR [NODE_RANK]]    (reads stdin until EOF)

It also removes the launcher's rank socket (ddpdoctor.protocol.rank_socket: a directory in /tmp,
named in its environment), which a killed launcher leaves behind.

A launcher that ends normally has ended its job itself before it closes the pipe; when the reaper
still finds processes of the job at EOF, the launcher died, and it says so in the run directory
(RUN_DIR/launcher-killed.json, ddpdoctor.protocol.processes) so that a watcher's verdict is that
the job was stopped with its launcher. The launcher of one node of a job over several nodes says
it in that node's record instead (nodes/node-<N>/node.json: stopped_for "launcher_killed"), so that
the other nodes tell the job's end as what it was.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from ddpdoctor.launch.stop_protocol import end_sruns, is_srun, slurm_steps
from ddpdoctor.protocol import processes
from ddpdoctor.protocol.rank_socket import remove_left_behind

ENV_LAUNCH_ID = "DDPDOCTOR_LAUNCH_ID"
ENV_SOCKET_DIR = "DDPDOCTOR_REAPER_SOCKET_DIR"  # the rank socket's directory, to remove at the end
GRACE_S = 3.0  # SIGTERM first; whatever runs this long after gets SIGKILL
MAX_ROUNDS = 20


def new_launch_id() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def marked_pids(launch_id: str, *, proc: str = "/proc") -> list[int]:
    """The pids whose environment holds DDPDOCTOR_LAUNCH_ID=<launch_id> (this user's processes:
    another user's environ cannot be read, and is none of ours)."""
    needle = f"{ENV_LAUNCH_ID}={launch_id}".encode()
    me = os.getpid()
    found = []
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"{proc}/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def job_pids(launch_id: str, *, proc: str = "/proc") -> list[int]:
    """The launch's processes that are its to end: marked, alive, and not a worker of a Ray
    cluster that outlives the job (_left_to_ray)."""
    marked = [p for p in marked_pids(launch_id, proc=proc) if _alive(p, proc=proc)]
    ours = set(marked)
    return [p for p in marked if not _left_to_ray(p, ours, proc=proc)]


def _left_to_ray(pid: int, marked: set[int], *, proc: str = "/proc") -> bool:
    """A worker started by the raylet of a Ray cluster that was running before the job (`ray
    start`, then the job through RAY_ADDRESS): the raylet carries no marker. Such a worker has
    the job's environment through its runtime_env (runtime/ray_env.py), and it is Ray's to end:
    Ray ends the job's workers once its driver is gone, and keeps its detached actors, which are
    the cluster's by design (Ray Train's AutoscalingCoordinator, a user's service). Killing one
    of those would not end it: Ray restarts it, with the job's environment again. The ranks
    among them were already stopped by the launcher (it tracks their pids). A local cluster
    that the job's `ray.init()` started is the job's: its raylet is marked, its workers ended."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            parent = int(fh.read().rsplit(b")", 1)[1].split()[1])
        if parent in marked:
            return False
        with open(f"{proc}/{parent}/comm", "rb") as fh:
            return fh.read().strip() == b"raylet"
    except (OSError, IndexError, ValueError):
        return False


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _alive(pid: int, *, proc: str = "/proc") -> bool:
    """Running and not a zombie (a zombie waits for its parent; it is already over)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[0] != b"Z"
    except (OSError, IndexError):
        return False


def end_marked(launch_id: str, *, grace_s: float = GRACE_S) -> int:
    """End every process of the launch; returns how many were found. Bounded in time.

    srun gets SIGTERM (it then ends its step) but never SIGKILL, which would leak its Slurm
    allocation: once the rest is gone, stop_protocol.end_sruns waits for it, cancels its steps
    if it lingers, and kills it only after that."""
    seen: set[int] = set()
    sruns: set[int] = set()
    steps: set[str] = set()
    for _ in range(MAX_ROUNDS):
        pids = [p for p in job_pids(launch_id) if p not in sruns]
        if not pids:
            break
        seen.update(pids)
        steps.update(slurm_steps(pids))
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        left = [p for p in pids if _alive(p)]
        sruns.update(p for p in left if is_srun(p))
        _signal([p for p in left if p not in sruns], signal.SIGKILL)
        grace_s = min(grace_s, 0.5)  # later rounds: only what was forked meanwhile
    end_sruns(sruns, steps)
    return len(seen)


class Reaper:
    """The watchdog process: started before the job, told the launcher has gone by its pipe."""

    def __init__(
        self,
        launch_id: str,
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        node_rank: int | None = None,
        socket_dir: Path | None = None,
    ) -> None:
        self.launch_id = launch_id
        clean = {
            k: v for k, v in (env or os.environ).items() if k not in (ENV_LAUNCH_ID, ENV_SOCKET_DIR)
        }
        if socket_dir is not None:
            clean[ENV_SOCKET_DIR] = str(socket_dir)
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddpdoctor.launch.reaper",
                launch_id,
                *([run_dir] if run_dir else []),
                *([str(node_rank)] if run_dir and node_rank is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean,
            start_new_session=True,  # no terminal signal reaches it; it outlives the launcher
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self, timeout: float = 10.0) -> None:
        """The launcher is done: the reaper sweeps once more and exits."""
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2, 3) or not argv[0]:
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Blocks until the launcher closes the pipe or dies: then its job must end too.
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    left = job_pids(argv[0])
    if left and len(argv) == 2:
        processes.say_launcher_killed(argv[1], len(left))
    elif left and len(argv) == 3 and argv[2].isdigit():
        # a node of a job over several nodes: its own record says so, for the other nodes
        from ddpdoctor.protocol.node_records import say_launcher_killed
        from ddpdoctor.protocol.rundir import RunDir

        with contextlib.suppress(Exception):
            say_launcher_killed(RunDir(Path(argv[1])), int(argv[2]), time.time())
    end_marked(argv[0])
    socket_dir = os.environ.get(ENV_SOCKET_DIR)
    if socket_dir:  # (the ranks are gone: nobody connects any more)
        remove_left_behind(socket_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
