"""The launchers of a job: the processes that started its ranks but are not ranks themselves.

An mp.spawn parent, torchrun's agent, slurmstepd under srun, mpirun's daemon: each rank's hello
names its parent (pid and command line, ddpdoctor/runtime/info.py), so every watcher, `watch` on
another node included, can list them from the run directory alone. They are never ranks: a
process is a rank only once it has joined a process group.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpdoctor.rank_ranges import named_ranks

MAX_ARGV_CHARS = 120


@dataclass(frozen=True)
class LauncherView:
    host: str | None
    pid: int
    argv: tuple[str, ...]
    ranks: tuple[int, ...]

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
        return f"{self.label} ({where}{self.pid}) started {named_ranks(self.ranks)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "argv": list(self.argv),
            "ranks": list(self.ranks),
        }


def launcher_views(ranks: Mapping[int, Any]) -> tuple[LauncherView, ...]:
    """One view per (host, parent pid) of the ranks' trackers (they carry .host, .ppid and
    .parent_argv from the hello event), ordered by their lowest rank."""
    found: dict[tuple[str | None, int], tuple[tuple[str, ...], list[int]]] = {}
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
    views = [
        LauncherView(host=host, pid=pid, argv=argv, ranks=tuple(sorted(members)))
        for (host, pid), (argv, members) in found.items()
    ]
    return tuple(sorted(views, key=lambda v: (min(v.ranks), v.host or "", v.pid)))


def launcher_lines(launchers: tuple[LauncherView, ...]) -> list[str]:
    """The text view's lines: `launcher: python multigpu.py 4 2 (vm:1234) started ranks 0-1`."""
    return [f"launcher: {view.describe()}" for view in launchers]
