"""Checks that test several things collect Problems and turn them into one CheckOutcome.

The worst problem sets the status and the summary; every problem is listed in the details, and
their fixes are joined, so one run of the doctor shows everything that needs changing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ddpdoctor.checks.model import CheckOutcome, failed, passed, warning


@dataclass(frozen=True)
class Problem:
    message: str
    fix: str
    fatal: bool = True  # a failure; False: a warning


def outcome_from(
    problems: Iterable[Problem],
    *,
    ok_summary: str,
    details: Iterable[str] = (),
    facts: Mapping[str, Any] | None = None,
) -> CheckOutcome:
    """passed(ok_summary) without problems; else failed/warning led by the first fatal problem."""
    found = list(problems)
    extra = tuple(details)
    if not found:
        return passed(ok_summary, details=extra, facts=facts)
    fatal = [p for p in found if p.fatal]
    lead = fatal or found
    summary = lead[0].message
    others = len(found) - 1
    if others:
        summary += f" (and {others} more problem{'s' if others != 1 else ''})"
    fixes: list[str] = []
    for problem in fatal + [p for p in found if not p.fatal]:
        if problem.fix not in fixes:
            fixes.append(problem.fix)
    # A single problem is the summary already; several are each listed.
    listed = [f"{'problem' if p.fatal else 'warning'}: {p.message}" for p in found]
    listed = (listed if len(found) > 1 else []) + list(extra)
    make = failed if fatal else warning
    return make(summary, fix="; ".join(fixes), details=listed, facts=facts)
