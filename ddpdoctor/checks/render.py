"""The doctor's report as text: results grouped, a symbol per status, the fix under every warning
and failure, details with -v, and a closing summary line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.registry import GROUP_TITLES
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.console import STATUS_STYLES, UNICODE_SYMBOLS


def render_report(
    report: DoctorReport,
    console: Console,
    *,
    verbose: bool = False,
    symbols: dict[str, str] = UNICODE_SYMBOLS,
) -> None:
    console.print(Text(f"ddpdoctor doctor  host {report.host}  ddpdoctor {report.version}"))
    groups: dict[str, list[CheckResult]] = {}
    for result in report.results:
        groups.setdefault(result.group, []).append(result)
    for group, results in groups.items():
        console.print()
        console.print(Text(GROUP_TITLES.get(group, group), style="bold"))
        print_results(console, results, verbose=verbose, symbols=symbols)
    console.print()
    console.print(summary_line(report), soft_wrap=not console.is_terminal)


def print_results(
    console: Console,
    results: Sequence[CheckResult],
    *,
    verbose: bool,
    symbols: dict[str, str] = UNICODE_SYMBOLS,
) -> None:
    """Results as rows: on a terminal a two-column grid (a long summary wraps under its own text,
    not under the symbol); elsewhere one unwrapped, unpadded line per row, for logs and grep."""
    if console.is_terminal:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=3, justify="right", no_wrap=True)
        grid.add_column(overflow="fold")
        for result in results:
            for symbol, line in result_lines(result, verbose=verbose, symbols=symbols):
                grid.add_row(symbol, line)
        console.print(grid)
        return
    for result in results:
        for symbol, line in result_lines(result, verbose=verbose, symbols=symbols):
            console.print(Text.assemble("  ", symbol, " ", line), soft_wrap=True)


def result_lines(
    result: CheckResult, *, verbose: bool, symbols: dict[str, str] = UNICODE_SYMBOLS
) -> Iterable[tuple[Text, Text]]:
    """(symbol, text) rows: the result line, then its details and its fix."""
    status = result.status.value
    head = Text()
    head.append(f"{result.title}: ", style="bold" if result.status.is_problem else "")
    head.append(result.summary)
    yield Text(symbols[status], style=STATUS_STYLES[status]), head
    show_details = verbose or result.status in (Status.FAIL, Status.ERROR)
    if show_details:
        for detail in result.details:
            yield Text(" "), Text(f"  {detail}", style="dim")
    if result.fix and result.status in (Status.WARN, Status.FAIL, Status.ERROR):
        fix = Text("  fix: ", style=STATUS_STYLES[status])
        fix.append(result.fix)
        yield Text(" "), fix


def summary_line(report: DoctorReport) -> Text:
    counts = report.counts
    parts = [
        (f"{counts['pass']} passed", "green"),
        (f"{counts['warn']} warning{'s' if counts['warn'] != 1 else ''}", "yellow"),
        (f"{counts['fail']} failed", "bold red" if counts["fail"] else ""),
        (f"{counts['skip']} skipped", "dim"),
    ]
    if counts["error"]:
        parts.append((f"{counts['error']} could not run", "magenta"))
    line = Text("Summary: ", style="bold")
    for i, (text, style) in enumerate(parts):
        if i:
            line.append(", ")
        line.append(text, style=style)
    verdict = "problems found" if report.exit_code else "ready for DDP"
    if report.strict and counts["warn"] and not (counts["fail"] or counts["error"]):
        verdict = "warnings fail under --strict"
    line.append(f" — {verdict} (exit {int(report.exit_code)}; {report.elapsed_s:.1f} s)")
    return line
