"""The launchers of a job: the processes that started its ranks but are not ranks themselves.

An mp.spawn parent, torchrun's agent, slurmstepd under srun, mpirun's daemon: each rank's hello
names its parent (pid and command line, ddpdoctor/runtime/info.py), so every watcher, `watch` on
another node included, can list them from the run directory alone. They are never ranks: a
process is a rank only once it has joined a process group.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddpdoctor.launch.user_command import GUARD_MODULE
from ddpdoctor.rank_ranges import named_ranks

MAX_ARGV_CHARS = 120
# multiprocessing's own helpers, children of an mp.spawn parent that are never ranks
HELPER_SNIPPETS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
# ddpdoctor's own guard around a user's command (launch/job_guard.py): a rank whose parent it is
# was the command itself, started by `ddpdoctor run`, and has no launcher of the job's own
JOB_GUARD = ("-m", GUARD_MODULE)

ChildLister = Callable[[int], list[tuple[int, tuple[str, ...]]]]


def proc_children(pid: int) -> list[tuple[int, tuple[str, ...]]]:
    """The live children of a process on this host, from /proc: [(pid, argv)]; [] when unknown."""
    found: list[tuple[int, tuple[str, ...]]] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids = [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            continue
        for child in pids:
            try:
                with open(f"/proc/{child}/cmdline", "rb") as fh:
                    raw = fh.read(4096)
            except OSError:
                continue
            found.append(
                (child, tuple(w.decode("utf-8", "replace") for w in raw.split(b"\0") if w))
            )
    return found


@dataclass(frozen=True)
class LauncherView:
    host: str | None
    pid: int
    argv: tuple[str, ...]
    ranks: tuple[int, ...]
    # Its live children that have not joined a process group (never ranks, or not yet), known
    # only while the job runs and for a launcher on the watcher's host; None when unknown.
    not_joined: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        """`python multigpu.py 4 2`, `torchrun --nproc-per-node 2 train.py`, `slurmstepd: [3.0]`."""
        if not self.argv:
            return f"pid {self.pid}"
        words = [os.path.basename(self.argv[0]), *self.argv[1:]]
        text = shlex.join(words) if len(words) > 1 else words[0]
        if len(text) > MAX_ARGV_CHARS:
            text = text[: MAX_ARGV_CHARS - 1] + "…"
        return text

    def describe(self) -> str:
        where = f"{self.host}:" if self.host else "pid "
        text = f"{self.label} ({where}{self.pid}) started {named_ranks(self.ranks)}"
        if self.not_joined:
            pids = ", ".join(map(str, self.not_joined))
            text += (
                f"; {len(self.not_joined)} more of its processes (pid {pids}) have not joined "
                "a process group"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "argv": list(self.argv),
            "ranks": list(self.ranks),
            "not_joined": None if self.not_joined is None else list(self.not_joined),
        }


# (host, parent pid) -> (the parent's argv, its ranks)
LauncherGroups = dict[tuple[str | None, int], tuple[tuple[str, ...], list[int]]]


def launcher_groups(ranks: Mapping[int, Any]) -> LauncherGroups:
    """The ranks' trackers grouped by the process that started them (host, parent pid)."""
    found: LauncherGroups = {}
    for rank, tracker in ranks.items():
        ppid = getattr(tracker, "ppid", None)
        if ppid is None:
            continue
        key = (tracker.host, ppid)
        argv = tuple(getattr(tracker, "parent_argv", ()) or ())
        entry = found.setdefault(key, (argv, []))
        entry[1].append(rank)
        if argv and not entry[0]:
            found[key] = (argv, entry[1])
    return found


def launcher_views(
    ranks: Mapping[int, Any],
    *,
    live: bool = False,
    children: ChildLister = proc_children,
    host: str | None = None,
    groups: LauncherGroups | None = None,
) -> tuple[LauncherView, ...]:
    """One view per (host, parent pid) of the ranks' trackers (they carry .host, .ppid, .pid and
    .parent_argv from the hello event), ordered by their lowest rank. `live`: also count each
    local launcher's children that are no rank (a rank that has not called init_process_group).
    `groups`: what `launcher_groups(ranks)` returned, when the caller kept it (it changes only
    with a hello; the snapshot asks for the views every poll)."""
    found = launcher_groups(ranks) if groups is None else groups
    here = host or (socket.gethostname() if live else None)
    rank_pids: set[Any] | None = None  # (made once a local launcher needs it)
    views = []
    for (where, pid), (argv, members) in found.items():
        if is_job_guard(argv):
            continue  # the command itself is the rank: ddpdoctor run started it, not a launcher
        not_joined = None
        if live and where == here and argv and current_argv(pid) == argv:
            if rank_pids is None:
                rank_pids = {getattr(t, "pid", None) for t in ranks.values()}
            not_joined = tuple(
                sorted(
                    child
                    for child, child_argv in children(pid)
                    if child not in rank_pids and not _is_helper(child_argv)
                )
            )
        views.append(LauncherView(where, pid, argv, tuple(sorted(members)), not_joined))
    return tuple(sorted(views, key=lambda v: (min(v.ranks), v.host or "", v.pid)))


def current_argv(pid: int) -> tuple[str, ...]:
    """A local process's command line now (empty when gone): the launcher a hello named is
    still the process of that pid, not a newer one that reuses it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return ()
    return tuple(w.decode("utf-8", "replace") for w in raw.split(b"\0") if w)


def is_job_guard(argv: tuple[str, ...]) -> bool:
    """ddpdoctor's guard around a user's command (`python -m ddpdoctor.launch.job_guard CMD`)."""
    return tuple(argv[1:3]) == JOB_GUARD


def _is_helper(argv: tuple[str, ...]) -> bool:
    return any(snippet in word for word in argv for snippet in HELPER_SNIPPETS)


def launcher_lines(launchers: tuple[LauncherView, ...]) -> list[str]:
    """The text view's lines: `launcher: python multigpu.py 4 2 (vm:1234) started ranks 0-1`."""
    return [f"launcher: {view.describe()}" for view in launchers]


def nodes_missing(
    nnodes: int | None, nodes: Mapping[int, Any], ranks: Mapping[int, Any]
) -> tuple[int, ...]:
    """The launchers of a job over several nodes that have not recorded themselves (`nodes`: the
    node records read), while no rank has started (once one has, the rendezvous is complete and
    no node is missing)."""
    expected = nnodes or 1
    if expected < 2 or not nodes or ranks:
        return ()
    return tuple(node for node in range(expected) if node not in nodes)
