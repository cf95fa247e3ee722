"""Is a rank's process still alive? Only answerable for ranks on this host.

A rank on another host (or in a run directory copied from another machine) gets None: the monitor
then reasons from event times instead of calling the rank "gone". A pid that exists but belongs
to a process started after the rank's hello is a reused pid, so the rank is gone. A process is
gone only once nothing of it can write any more: not while one of its threads runs.
"""

from __future__ import annotations

import socket

import psutil

# A process created this much after the rank said hello is not that rank (clock granularity).
_PID_REUSE_SLACK_S = 2.0


def this_host() -> str:
    return socket.gethostname()


def is_local(host: str | None, local_host: str | None = None) -> bool:
    if not host:
        return False
    local = local_host or this_host()
    return host == local or host.split(".")[0] == local.split(".")[0]


def pid_alive(pid: int, started_before_t: float | None = None) -> bool:
    """True while `pid` runs and is the process that said hello. A zombie is dead once it is
    its thread group's last thread: a main thread that ended before the others (a thread group
    leader that left with pthread_exit, or the first to leave as the process exits) shows as a
    zombie while its other threads still run, and write (a rank's heartbeat and writer thread)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1:
            return False
        return not (
            started_before_t is not None
            and proc.create_time() > started_before_t + _PID_REUSE_SLACK_S
        )
    except psutil.AccessDenied:
        return True  # it exists; we may only not look at it
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False
    except psutil.Error:
        return False
