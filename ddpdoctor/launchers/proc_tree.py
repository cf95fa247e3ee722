"""The processes below a process on this host, from /proc.

psutil's `children(recursive=True)` reads the stat file of every process on the host to build a
parent map: ~1 ms here with 90 processes, tens of ms on a GPU node running hundreds, and the
launcher and the monitor ask a few times a second while the job trains on the same cores. The
kernel lists each thread's children in /proc/<pid>/task/<tid>/children, so walking down from the
job's root reads only the files of the job's own processes (~20 µs for a 2-rank job).

Only the standard library unless the kernel lacks those files (then psutil): the job guard, which
starts before anything else of the job, uses it too.
"""

from __future__ import annotations

import os


def descendants(pid: int) -> list[int]:
    """The pids below `pid` (in no particular order), [] when it has gone."""
    found = _from_children_files(pid)
    if found is not None:
        return found
    import psutil  # a kernel without CONFIG_PROC_CHILDREN: psutil's scan of every process

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def _from_children_files(pid: int) -> list[int] | None:
    """None when the kernel has no children files (then the caller scans instead)."""
    found: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as fh:
                    text = fh.read()
            except FileNotFoundError:
                if parent == pid and tid == threads[0] and _no_children_files():
                    return None
                continue  # a thread that ended meanwhile
            except OSError:
                continue
            for word in text.split():
                child = int(word)
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    todo.append(child)
    return found


def _no_children_files() -> bool:
    return not os.path.exists(f"/proc/self/task/{os.getpid()}/children")
