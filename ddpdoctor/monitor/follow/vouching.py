"""Vouching: which ranks are processes of the job, as ddpdoctor saw them itself.

A rank's events are what a file says. They count, as a rank that can be a culprit or a reason to
stop the job, only once ddpdoctor has seen the process behind them: the pid its hello names runs
on this host, was started before that hello, and is the process that writes the rank's event
file (it holds that file open), or one the run started (its environment names this run
directory, or it descends from the run's launcher). A rank on another host is vouched for by
that host's launcher, which makes the same check and names in its node summary the ranks it
refused (ddpdoctor.monitor.follow.node_publisher).

A process that ended before ddpdoctor first looked at it (a replica that lived a second on a
loaded machine) is vouched for by the kernel instead: when its runtime learned its rank it told
`ddpdoctor run`'s socket so, and the kernel named the pid that connected
(ddpdoctor.protocol.rank_socket). That pid said that rank, and nothing else can say it for them.

A rank that fails the check is refused: its record is dropped and its later events are not
folded in (ddpdoctor.monitor.model.state.RunState.refuse), and a warning says so. A refusal
costs at worst a missed fault (a real rank that ended unseen and unheard: a watcher that did not
launch the job has no socket); believing a file costs a healthy job stopped for a rank that never
existed.

Ranks are looked at only while the job runs on this host (a launcher of the run, or a watcher
that sees one of the run's ranks alive here): a run read after the fact has no process left to
look at, and its ranks are taken from their files, bounded by the world of the launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.rank_ranges import named_ranks

# A process created this much after the rank said hello is not that rank (clock granularity).
_PID_REUSE_SLACK_S = 2.0
MAX_FDS_LOOKED_AT = 4096  # a rank's descriptors looked through for its event file
MAX_ANCESTORS = 64
MAX_SPENT = 1 << 16
ENV_RUN_DIR = b"DDPDOCTOR_RUN_DIR="


# What a remote check answers, beside why a rank is refused: its host's launcher vouches for
# it, or has not said yet.
VOUCHED = "vouched"
PENDING = "pending"
RemoteCheck = Callable[[int, Any], str]


class RankSaid(Protocol):
    """The launcher's rank socket as vouching uses it (ddpdoctor.protocol.rank_socket)."""

    def collect(self) -> None: ...

    def rank_of(self, pid: int) -> int | None: ...


@dataclass(frozen=True)
class Refusal:
    rank: int
    pid: int | None
    host: str | None
    why: str  # "pid 999999 is no process on vm"
    by: str | None = None  # "node 1's launcher" when another host's launcher refused it

    def to_json(self) -> list[Any]:
        return [self.rank, self.pid, self.why]


def vouch_local(
    pid: int | None,
    hello_t: float | None,
    events_file: Path,
    run_dir: Path,
    roots: Iterable[int] = (),
) -> str | None:
    """None when the process `pid` on this host is the rank that wrote `events_file`'s hello,
    else why not (one short clause)."""
    if pid is None:
        return "its hello names no process"
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"pid {pid} has ended"
        if hello_t is not None and proc.create_time() > hello_t + _PID_REUSE_SLACK_S:
            return f"pid {pid} was started after that hello (another process)"
    except psutil.AccessDenied:
        return f"pid {pid} belongs to another user"
    except psutil.Error:
        return f"pid {pid} is no process"
    if holds_file(pid, events_file) or _names_run(pid, run_dir) or _descends(proc, set(roots)):
        return None
    return f"pid {pid} is not a process of this run (it neither writes that file nor was started by it)"


def holds_file(pid: int, events_file: Path) -> bool:
    """Whether the process holds `events_file` open (the runtime's writer keeps it so)."""
    try:
        target = events_file.stat()
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds[:MAX_FDS_LOOKED_AT]:
        try:
            found = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def _names_run(pid: int, run_dir: Path) -> bool:
    """Whether the process's environment names this run directory (the run started it)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read(1 << 20)
    except OSError:
        return False
    for item in env.split(b"\0"):
        if item.startswith(ENV_RUN_DIR):
            try:
                return os.path.samefile(item[len(ENV_RUN_DIR) :].decode(errors="replace"), run_dir)
            except (OSError, ValueError):
                return False
    return False


def _descends(proc: psutil.Process, roots: set[int]) -> bool:
    if not roots:
        return False
    try:
        for parent in proc.parents()[:MAX_ANCESTORS]:
            if parent.pid in roots:
                return True
    except psutil.Error:
        return False
    return False


class Vouching:
    """The ranks this watcher has vouched for (rank -> pid) and those it refused."""

    def __init__(
        self,
        run_dir: Path,
        events_file: Callable[[int], Path],
        said: RankSaid | None = None,
    ) -> None:
        """`said`: the launcher's rank socket (ddpdoctor.protocol.rank_socket), whose kernel-named
        pids vouch for a rank whose process had ended before it was first looked at."""
        self.run_dir = run_dir
        self.events_file = events_file
        self.said = said
        self.vouched: dict[int, int] = {}
        self.refused: dict[int, Refusal] = {}
        # pids a rank has moved on from (a restart): their word to the socket vouches no more
        self._spent: set[int] = set()

    def look(
        self,
        state: Any,
        here: Callable[[str | None], bool],
        roots: Iterable[int] = (),
        remote: RemoteCheck | None = None,
    ) -> list[Refusal]:
        """Look at every rank not vouched for yet (its current pid); refuse those that fail, in
        `state` too. A rank of another host is `remote`'s to judge (its host's launcher's word:
        VOUCHED, PENDING or why not); without it, it is taken as its host's launcher's.
        Returns the new refusals."""
        new: list[Refusal] = []
        roots = tuple(roots)
        if self.said is not None:
            self.said.collect()  # (the kernel's backlog of connections, emptied every look)
        for rank, tracker in list(state.ranks.items()):
            if state.ranks.get(rank) is not tracker:
                continue  # refused in this pass (another rank's pid it named)
            pid = tracker.pid
            before = self.vouched.get(rank)
            if before == pid and pid is not None:
                continue
            if before is not None and len(self._spent) < MAX_SPENT:
                self._spent.add(before)
            if tracker.hello_t is None and tracker.host is None:
                if getattr(tracker, "events_seen", 0) and rank not in getattr(
                    state, "reported", ()
                ):
                    new.append(self._refuse(state, rank, tracker, "its events have no hello"))
                continue
            why: str | None
            if not here(tracker.host):
                why = remote(rank, tracker) if remote is not None else VOUCHED
            elif tracker.exit_code == 0 and tracker.error_t is None:
                continue  # ended cleanly before a first look: nothing to act on, nothing to refute
            else:
                why = self._pid_taken(state, rank, tracker)
                if why is None:
                    why = vouch_local(
                        pid, tracker.hello_t, self.events_file(rank), self.run_dir, roots
                    )
                    if why is not None and self._said_before_it_ended(rank, pid):
                        why = None
            if why is None or why == VOUCHED:
                if pid is not None:
                    self.vouched[rank] = pid
            elif why != PENDING:
                new.append(self._refuse(state, rank, tracker, why))
        return new

    def _said_before_it_ended(self, rank: int, pid: int | None) -> bool:
        """Whether the process `pid`, ended now, told the launcher's socket it was `rank`: the
        kernel named that pid, so the rank was a process of the job though none is left to see.
        Only for a process that has ended: a live one is looked at as it is."""
        if self.said is None or pid is None or pid in self._spent:
            return False
        if self.said.rank_of(pid) != rank:
            return False
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def _pid_taken(self, state: Any, rank: int, tracker: Any) -> str | None:
        """A rank is one process: why `rank` is refused when another rank of the same host
        already names its pid (None when no other does). Of two ranks naming one pid, the one
        whose event file the process holds open is that process (its runtime keeps its own
        file open); the other's hello is a copy or a forgery. A rank vouched for before that
        turns out to be the other one is refused in turn."""
        pid = tracker.pid
        others = [
            r
            for r, t in state.ranks.items()
            if r != rank and t.pid == pid and t.host == tracker.host and pid is not None
        ]
        if not others:
            return None
        if holds_file(pid, self.events_file(rank)):
            for other in others:  # this process is `rank`: the others only named its pid
                if holds_file(pid, self.events_file(other)):
                    continue
                self.vouched.pop(other, None)
                why = f"pid {pid} is rank {rank}'s process (one process is one rank)"
                self._refuse(state, other, state.ranks[other], why)
            return None
        owner = next((r for r in others if self.vouched.get(r) == pid), None)
        if owner is None:
            owner = next((r for r in others if holds_file(pid, self.events_file(r))), None)
        if owner is None:
            return None  # none holds its file (each ended, or not opened yet): the usual checks
        return f"pid {pid} is rank {owner}'s process (one process is one rank)"

    def _refuse(
        self, state: Any, rank: int, tracker: Any, why: str, *, by: str | None = None
    ) -> Refusal:
        refusal = Refusal(rank, tracker.pid, tracker.host, why, by)
        self.refused[rank] = refusal
        state.refuse(rank)
        return refusal

    def findings(self, world: int) -> list[Finding]:
        if not self.refused:
            return []
        lines = []
        for refusal in sorted(self.refused.values(), key=lambda r: r.rank)[:8]:
            where = f" on {refusal.host}" if refusal.host else ""
            who = f" ({refusal.by})" if refusal.by else ""
            lines.append(f"rank {refusal.rank}{where}: {refusal.why}{who}")
        ranks = named_ranks(self.refused)
        return [
            Finding(
                "run.unvouched",
                Severity.WARNING,
                f"{ranks} not counted: no process of the job behind {'its' if len(self.refused) == 1 else 'their'} "
                f"events ({'; '.join(lines)}); the verdict is from the {world} rank(s) ddpdoctor saw",
                "The run directory holds events that no process of this job wrote (a file "
                "edited or copied in, or left from another run): they are reported, never acted "
                "on. Remove them, or give each run its own run directory.",
            )
        ]
