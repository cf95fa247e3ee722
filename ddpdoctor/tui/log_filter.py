"""Which log lines the logs panel shows: a set of ranks and a minimum level, typed as one line.

`3`, `0,2-3`, `warn`, `1 error`, `rank 1-2 level warn` and an empty line (everything) all parse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddpdoctor.monitor.model.snapshot import LogLine
from ddpdoctor.tui.fmt import ranks_text

LEVELS = ("info", "warn", "error")  # least to most severe; "info" shows every line
_LEVEL_WORDS = {
    "all": "info",
    "info": "info",
    "warn": "warn",
    "warning": "warn",
    "warnings": "warn",
    "error": "error",
    "errors": "error",
    "err": "error",
}
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class LogFilter:
    ranks: frozenset[int] | None = None  # None: every rank (and lines of no rank)
    level: str = "info"

    def accepts(self, line: LogLine) -> bool:
        if LEVELS.index(_level_of(line)) < LEVELS.index(self.level):
            return False
        return self.ranks is None or line.rank in self.ranks

    def apply(self, lines: Iterable[LogLine]) -> list[LogLine]:
        return [line for line in lines if self.accepts(line)]

    def describe(self) -> str:
        parts = []
        if self.ranks is not None:
            parts.append(f"rank {ranks_text(self.ranks)}")
        if self.level != "info":
            parts.append(f"{self.level} and worse")
        return ", ".join(parts) or "all lines"

    def text(self) -> str:
        """The filter as the user would type it (pre-fills the filter prompt)."""
        parts = []
        if self.ranks is not None:
            parts.append(ranks_text(self.ranks))
        if self.level != "info":
            parts.append(self.level)
        return " ".join(parts)

    def next_level(self) -> LogFilter:
        return LogFilter(self.ranks, LEVELS[(LEVELS.index(self.level) + 1) % len(LEVELS)])


def _level_of(line: LogLine) -> str:
    return line.level if line.level in LEVELS else "info"


def parse_log_filter(text: str) -> LogFilter:
    """Parse what the user typed; ValueError with a readable reason for anything else."""
    ranks: set[int] = set()
    level = "info"
    for token in re.split(r"[\s,]+", text.strip().lower()):
        if not token or token in ("rank", "ranks", "level"):
            continue
        if token in _LEVEL_WORDS:
            level = _LEVEL_WORDS[token]
            continue
        match = _RANGE.match(token)
        if not match:
            raise ValueError(f"{token!r} is neither a rank (3, 0-7) nor a level (all, warn, error)")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise ValueError(f"{token!r}: the range runs backwards")
        if high - low > 100_000:
            raise ValueError(f"{token!r}: range too large")
        ranks.update(range(low, high + 1))
    return LogFilter(frozenset(ranks) if ranks else None, level)
