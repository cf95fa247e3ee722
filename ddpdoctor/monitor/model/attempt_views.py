"""The frozen attempts of a run, as a snapshot carries them (`Snapshot.attempts`): each attempt's
start, end, ranks, steps and how its ranks' processes ended, and the launcher's restart budget.
Made by ddpdoctor.monitor.model.attempts; told by the recovery rule, the text and TUI views and
diagnosis.json (`attempts`, docs/contracts.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_TORCHRUN = re.compile(r"(?:^|/)torchrun$|^torch\.distributed\.(?:run|launch)$")
_MAX_RESTARTS_FLAG = re.compile(r"^--max[-_]restarts(?:=(\d+))?$")
BUDGET_BOUND = 10_000  # a budget from a file is a number like any other: bounded


@dataclass(frozen=True)
class RankEnding:
    """How one process of a rank ended, in the attempt it belonged to."""

    rank: int
    pid: int | None
    failed: bool
    cause: str  # "LoaderError: shard 10 unreadable", "killed by SIGKILL", "exit code 3"
    line: str | None = None  # the user's line it raised at: "train.py:27 in read_batch"
    t: float | None = None
    step: int | None = None
    signal: str | None = None
    exit_code: int | None = None  # its exit status, where an exit event or torchrun said it
    raised: bool = False  # `cause` is the exception it raised

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "failed": self.failed,
            "cause": self.cause,
            "line": self.line,
            "t": self.t,
            "step": self.step,
            "signal": self.signal,
        }


@dataclass(frozen=True)
class Attempt:
    number: int  # 0 for the first (torchrun's TORCHELASTIC_RESTART_COUNT)
    started_t: float | None
    ended_t: float | None  # None: the attempt still runs (the latest)
    ranks: tuple[int, ...]
    steps: int | None  # the highest step a rank of it reached
    endings: tuple[RankEnding, ...]  # its ranks' ends that ddpdoctor saw, earliest first

    @property
    def failures(self) -> tuple[RankEnding, ...]:
        return tuple(e for e in self.endings if e.failed)

    @property
    def duration_s(self) -> float | None:
        if self.started_t is None or self.ended_t is None:
            return None
        return max(0.0, self.ended_t - self.started_t)

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.number + 1,
            "started_t": self.started_t,
            "ended_t": self.ended_t,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "ranks": list(self.ranks),
            "steps": self.steps,
            "endings": [e.to_json() for e in self.endings],
        }


@dataclass(frozen=True)
class Attempts:
    """The run's attempts, the latest last, and its launcher's restart budget where known."""

    attempts: tuple[Attempt, ...]
    max_restarts: int | None  # None: ddpdoctor cannot see the budget
    budget_from: str | None  # where the budget was read ("TORCHELASTIC_MAX_RESTARTS", ...)
    rank_attempts: tuple[tuple[int, int], ...] = ()  # (rank, attempt number of its process)

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    @property
    def number(self) -> int:
        """The latest attempt, counted from 1."""
        return self.current.number + 1

    @property
    def total(self) -> int | None:
        return None if self.max_restarts is None else self.max_restarts + 1

    @property
    def restarts_left(self) -> int | None:
        if self.max_restarts is None:
            return None
        return max(0, self.max_restarts - self.current.number)

    @property
    def ended(self) -> tuple[Attempt, ...]:
        return self.attempts[:-1]

    def label(self) -> str:
        """ "attempt 2 of 3" (of an unknown budget: "attempt 2")."""
        total = self.total
        return f"attempt {self.number}" + (f" of {total}" if total else "")

    def attempt_of(self, rank: int) -> int:
        return dict(self.rank_attempts).get(rank, self.current.number)

    def may_restart(self, rank: int) -> bool:
        """The launcher restarts the ranks after this rank's process fails: its attempt is not
        the last its budget allows."""
        return self.max_restarts is not None and self.attempt_of(rank) < self.max_restarts

    def to_json(self, *, recovered: bool = False) -> dict[str, Any]:
        return {
            "current": self.number,
            "recovered": recovered,
            "max_restarts": self.max_restarts,
            "total": self.total,
            "budget_from": self.budget_from,
            "attempts": [a.to_json() for a in self.attempts],
        }


def budget_in_argv(argv: Sequence[str]) -> int | None:
    """torchrun's `--max-restarts N` / `--max_restarts=N` in a torchrun command line (before
    the script: what follows is the script's own)."""
    start = next((i for i, w in enumerate(argv) if _TORCHRUN.search(w)), None)
    if start is None:
        return None
    for i, word in enumerate(argv[start + 1 :], start + 1):
        if word.endswith(".py"):
            return None
        match = _MAX_RESTARTS_FLAG.match(word)
        if match is None:
            continue
        value = match.group(1) or (argv[i + 1] if i + 1 < len(argv) else "")
        return int(value) if value.isdigit() and int(value) <= BUDGET_BOUND else None
    return None
