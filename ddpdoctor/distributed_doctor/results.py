"""Results of the checks that only exist across ranks: the "cluster" group of the report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status

GROUP = "cluster"
GROUP_TITLE = "Across the cluster"


def cluster_result(
    check_id: str,
    title: str,
    status: Status,
    summary: str,
    *,
    fix: str | None = None,
    details: Sequence[str] = (),
    facts: dict[str, Any] | None = None,
) -> CheckResult:
    if status in (Status.WARN, Status.FAIL) and not fix:
        raise ValueError(f"a {status.value} result needs a fix: {summary!r}")
    return CheckResult(
        id=check_id,
        group=GROUP,
        title=title,
        status=status,
        summary=summary,
        details=tuple(details),
        fix=fix,
        facts=facts or {},
    )
