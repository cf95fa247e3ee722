"""The distributed doctor's one report as text: the nodes, a check × node matrix, the problems
found on the nodes (with their fixes), the cross-node results, and the summary line."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.registry import GROUP_TITLES
from ddpdoctor.checks.render import print_results, summary_line
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.console import STATUS_STYLES, UNICODE_SYMBOLS
from ddpdoctor.distributed_doctor.merge import MatrixRow
from ddpdoctor.distributed_doctor.nodes import NodeMap
from ddpdoctor.distributed_doctor.results import GROUP, GROUP_TITLE

# Up to this many nodes the matrix shows one column per node; beyond, the nodes that differ.
MAX_NODE_COLUMNS = 8


def render_distributed(
    report: DoctorReport,
    *,
    nodes: NodeMap,
    matrix: Sequence[MatrixRow],
    launcher: str,
    world_size: int,
    console: Console,
    verbose: bool = False,
    symbols: dict[str, str] = UNICODE_SYMBOLS,
) -> None:
    joined = sum(len(n.ranks) for n in nodes.nodes)
    noun = "rank" if world_size == 1 else "ranks"
    ranks = f"{world_size} {noun}" if joined == world_size else f"{joined} of {world_size} {noun}"
    console.print(
        Text(
            f"ddpdoctor doctor --distributed  {launcher}, {ranks} on {len(nodes)} "
            f"node{'s' if len(nodes) != 1 else ''}  ddpdoctor {report.version}"
        )
    )
    for node in nodes.nodes:
        console.print(Text(f"  {node.label}", style="dim"))
    if matrix:
        console.print()
        for line in matrix_lines(matrix, nodes, symbols=symbols):
            console.print(line, soft_wrap=True)
    local = [r for r in report.results if r.group != GROUP]
    shown = [r for r in local if verbose or r.status not in (Status.PASS, Status.SKIP)]
    groups: dict[str, list[CheckResult]] = {}
    for result in shown:
        groups.setdefault(result.group, []).append(result)
    for group, results in groups.items():
        console.print()
        console.print(Text(f"On the nodes: {GROUP_TITLES.get(group, group)}", style="bold"))
        print_results(console, results, verbose=verbose, symbols=symbols)
    cluster = [r for r in report.results if r.group == GROUP]
    if cluster:
        console.print()
        console.print(Text(GROUP_TITLE, style="bold"))
        print_results(console, cluster, verbose=verbose, symbols=symbols)
    console.print()
    console.print(summary_line(report))


def matrix_lines(
    rows: Sequence[MatrixRow], nodes: NodeMap, *, symbols: dict[str, str] = UNICODE_SYMBOLS
) -> list[Text]:
    width = max(len(row.id) for row in rows)
    columns = len(nodes) <= MAX_NODE_COLUMNS
    lines = [Text("Checks on each node", style="bold")]
    if columns:  # the node numbers above their columns
        indices = "  ".join(f"{n.index:>2}" for n in nodes.nodes)
        lines.append(Text(" " * (width + 5) + indices, style="bold"))
    for row in rows:
        line = Text("  ")
        line.append(symbols[row.worst.value], style=STATUS_STYLES[row.worst.value])
        line.append(f" {row.id.ljust(width)} ")
        if columns:
            for i, node in enumerate(nodes.nodes):
                status = row.by_node.get(node.index)
                mark = symbols[status.value] if status else " "
                line.append(("  " if i else "") + f"{mark:>2}", style=_style(status))
        if row.differs:
            differing = ", ".join(
                f"{row.by_node[i].value} on node {i}" for i in row.differs if i in row.by_node
            )
            line.append(f"   {differing}", style=STATUS_STYLES[row.worst.value])
        elif not columns:
            line.append(f"{row.worst.value} on all {len(row.by_node)} nodes", style="dim")
        lines.append(line)
    return lines


def _style(status: Status | None) -> str:
    return STATUS_STYLES[status.value] if status else "dim"
