"""Every rank's local report folded into one: a check × node matrix and one result per check.

A check's merged status is its worst status on any rank; when nodes disagree, the summary says
where the worst one was seen and the details list every node's own result, so "fails on node 3
only" reads at a glance.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.distributed_doctor.nodes import NodeMap


@dataclass(frozen=True)
class MatrixRow:
    id: str
    group: str
    title: str
    worst: Status
    by_node: Mapping[int, Status]  # node index -> the worst status among that node's ranks
    differs: tuple[int, ...]  # nodes whose status is not the most common one

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "worst": self.worst.value,
            "by_node": {str(node): status.value for node, status in sorted(self.by_node.items())},
            "differs": list(self.differs),
        }


def result_from_json(data: Mapping[str, Any]) -> CheckResult:
    return CheckResult(
        id=data["id"],
        group=data["group"],
        title=data.get("title", data["id"]),
        status=Status(data["status"]),
        summary=data.get("summary", ""),
        details=tuple(data.get("details") or ()),
        fix=data.get("fix"),
        facts=dict(data.get("facts") or {}),
        duration_s=float(data.get("duration_s") or 0.0),
    )


def merge_reports(
    reports: Mapping[int, Mapping[str, Any]], nodes: NodeMap
) -> tuple[list[CheckResult], list[MatrixRow]]:
    """`reports` maps rank -> that rank's `doctor --json` document."""
    per_check: dict[str, dict[int, CheckResult]] = {}
    for rank in sorted(reports):
        for data in reports[rank].get("results", []):
            result = result_from_json(data)
            per_check.setdefault(result.id, {})[rank] = result
    merged: list[CheckResult] = []
    matrix: list[MatrixRow] = []
    for by_rank in per_check.values():  # first-seen order = the registry's order
        merged.append(_merge_one(by_rank, nodes))
        matrix.append(_matrix_row(by_rank, nodes))
    return merged, matrix


def _merge_one(by_rank: Mapping[int, CheckResult], nodes: NodeMap) -> CheckResult:
    worst_rank = max(sorted(by_rank), key=lambda r: by_rank[r].status.severity)
    worst = by_rank[worst_rank]
    outcomes: dict[tuple[Status, str], list[int]] = {}
    for rank, result in sorted(by_rank.items()):
        outcomes.setdefault((result.status, result.summary), []).append(rank)
    if len(outcomes) == 1:
        return worst
    statuses = {status for status, _ in outcomes}
    summary = worst.summary
    if len(statuses) > 1:
        ranks = [r for r, res in by_rank.items() if res.status == worst.status]
        summary = f"{worst.summary} (on {nodes.describe(ranks)})"
    details = [
        f"{status.value} on {nodes.describe(ranks)}: {text}"
        for (status, text), ranks in sorted(outcomes.items(), key=lambda o: -o[0][0].severity)
    ]
    return CheckResult(
        id=worst.id,
        group=worst.group,
        title=worst.title,
        status=worst.status,
        summary=summary,
        details=(*details, *worst.details),
        fix=worst.fix,
        facts={"by_rank": {str(r): res.status.value for r, res in sorted(by_rank.items())}},
        duration_s=max(res.duration_s for res in by_rank.values()),
    )


def _matrix_row(by_rank: Mapping[int, CheckResult], nodes: NodeMap) -> MatrixRow:
    by_node: dict[int, Status] = {}
    for rank, result in by_rank.items():
        index = nodes.node_of(rank).index
        current = by_node.get(index)
        if current is None or result.status.severity > current.severity:
            by_node[index] = result.status
    common = Counter(by_node.values()).most_common(1)[0][0] if by_node else Status.PASS
    any_result = next(iter(by_rank.values()))
    return MatrixRow(
        id=any_result.id,
        group=any_result.group,
        title=any_result.title,
        worst=max(by_node.values(), key=lambda s: s.severity) if by_node else Status.PASS,
        by_node=by_node,
        differs=tuple(sorted(i for i, s in by_node.items() if s != common)),
    )


def matrix_json(rows: Sequence[MatrixRow]) -> list[dict[str, Any]]:
    return [row.to_json() for row in rows]
