"""The check model: a status, the frozen result of one check, and the outcome a check function returns.

A check function takes a CheckContext and returns an CheckOutcome built with `passed`, `warning`,
`failed` or `skipped`; it never prints. The registry stamps id, group and title onto it to make the
CheckResult that reports and JSON carry. Every warning and failure must carry a fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    ERROR = "error"  # the check itself raised or ran out of time: we could not tell
    FAIL = "fail"

    @property
    def severity(self) -> int:
        """Order from best to worst; `max(statuses, key=severity)` is the overall status."""
        return _SEVERITY[self]

    @property
    def is_problem(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


_SEVERITY = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


@dataclass(frozen=True)
class CheckOutcome:
    """What a check function returns; the registry turns it into a CheckResult."""

    status: Status
    summary: str
    fix: str | None = None
    details: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status in (Status.WARN, Status.FAIL) and not (self.fix and self.fix.strip()):
            raise ValueError(f"a {self.status.value} outcome needs a fix: {self.summary!r}")


@dataclass(frozen=True)
class CheckResult:
    id: str
    group: str
    title: str
    status: Status
    summary: str
    details: tuple[str, ...] = ()
    fix: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "title": self.title,
            "status": self.status.value,
            "summary": self.summary,
            "details": list(self.details),
            "fix": self.fix,
            "facts": _jsonable(self.facts),
            "duration_s": round(self.duration_s, 4),
        }


def passed(
    summary: str, *, details: Iterable[str] = (), facts: Mapping[str, Any] | None = None
) -> CheckOutcome:
    return CheckOutcome(Status.PASS, summary, None, tuple(details), dict(facts or {}))


def skipped(
    summary: str, *, details: Iterable[str] = (), facts: Mapping[str, Any] | None = None
) -> CheckOutcome:
    return CheckOutcome(Status.SKIP, summary, None, tuple(details), dict(facts or {}))


def warning(
    summary: str,
    *,
    fix: str,
    details: Iterable[str] = (),
    facts: Mapping[str, Any] | None = None,
) -> CheckOutcome:
    return CheckOutcome(Status.WARN, summary, fix, tuple(details), dict(facts or {}))


def failed(
    summary: str,
    *,
    fix: str,
    details: Iterable[str] = (),
    facts: Mapping[str, Any] | None = None,
) -> CheckOutcome:
    return CheckOutcome(Status.FAIL, summary, fix, tuple(details), dict(facts or {}))


def worst(outcomes: Iterable[CheckOutcome]) -> CheckOutcome | None:
    """The most severe of several outcomes (ties: the first), for checks that test several things."""
    best: CheckOutcome | None = None
    for outcome in outcomes:
        if best is None or outcome.status.severity > best.status.severity:
            best = outcome
    return best


def _jsonable(value: Any) -> Any:
    """Facts may hold tuples, sets, paths or enums; JSON gets lists and strings."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
