"""Findings as text: a symbol per severity, the summary, ranks, fix and evidence `file:line: text`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from ddpdoctor.console import UNICODE_SYMBOLS
from ddpdoctor.findings import Evidence, Finding, Severity

SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_SHOWN_CHARS = 240  # evidence lines are cut for the terminal; --json keeps them whole


def severity_symbols(symbols: dict[str, str] = UNICODE_SYMBOLS) -> dict[str, str]:
    """The console's status symbols, mapped to severities."""
    return {"error": symbols["fail"], "warning": symbols["warn"], "info": "i"}


def render_findings(
    findings: Sequence[Finding],
    console: Console,
    *,
    files: int,
    lines: int,
    symbols: dict[str, str] = UNICODE_SYMBOLS,
    unicode: bool = True,
) -> None:
    """`unicode=False` for streams that cannot encode it: log text is made ASCII, never a crash."""
    marks = severity_symbols(symbols)
    for finding in findings:
        for indent, text in finding_lines(finding, marks):
            shown = text if unicode else to_ascii(text)
            if console.is_terminal:  # wrapped continuation lines stay under their indent
                console.print(Padding(shown, (0, 0, 0, indent)), overflow="fold")
            else:  # files and pipes get whole lines, as grep and editors expect
                console.print(Text(" " * indent) + shown, soft_wrap=True)
        console.print()
    closing = summary_line(findings, files=files, lines=lines)
    console.print(closing if unicode else to_ascii(closing), soft_wrap=not console.is_terminal)


_ASCII_FOR = str.maketrans({"…": "...", "—": "-", "–": "-", "’": "'", "“": '"', "”": '"'})


def to_ascii(text: Text) -> Text:
    """The same styled text with every non-ASCII character replaced."""
    plain = text.plain.translate(_ASCII_FOR)
    plain = plain.encode("ascii", "replace").decode("ascii")
    if len(plain) == len(text.plain):
        copy = text.copy()
        copy.plain = plain
        return copy
    return Text(plain, style=text.style)


def finding_lines(finding: Finding, marks: dict[str, str]) -> Iterable[tuple[int, Text]]:
    """(indent, text) pairs: the headline, then ranks, fix and evidence indented under it."""
    severity = finding.severity.value
    head = Text()
    head.append(marks[severity], style=SEVERITY_STYLES[severity])
    head.append(f" {severity}: ", style=SEVERITY_STYLES[severity])
    head.append(finding.summary, style="bold" if finding.severity is Severity.ERROR else "")
    head.append(f"  [{finding.id}]", style="dim")
    yield 0, head
    if finding.ranks:
        label = "rank" if len(finding.ranks) == 1 else "ranks"
        yield 4, Text(f"{label}: " + ", ".join(map(str, finding.ranks)))
    if finding.fix:
        fix = Text("fix: ", style=SEVERITY_STYLES[severity])
        fix.append(finding.fix)
        yield 4, fix
    for evidence in finding.evidence:
        yield 4, Text(evidence_text(evidence), style="dim")


def evidence_text(evidence: Evidence) -> str:
    text = evidence.text
    if len(text) > MAX_SHOWN_CHARS:
        text = text[:MAX_SHOWN_CHARS] + "…"
    if evidence.file is None:
        return text if evidence.line is None else f"line {evidence.line}: {text}"
    return f"{_short_path(evidence.file)}:{evidence.line}: {text}"


def _short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return relative if not relative.startswith("../..") else path


def summary_line(findings: Sequence[Finding], *, files: int, lines: int) -> Text:
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    errors, warnings, infos = (
        counts[Severity.ERROR],
        counts[Severity.WARNING],
        counts[Severity.INFO],
    )
    line = Text("Summary: ", style="bold")
    parts = [
        (f"{errors} error{'s' if errors != 1 else ''}", "bold red" if errors else ""),
        (f"{warnings} warning{'s' if warnings != 1 else ''}", "yellow" if warnings else ""),
        (f"{infos} info", ""),
    ]
    for i, (text, style) in enumerate(parts):
        if i:
            line.append(", ")
        line.append(text, style=style)
    read = f"{files} file{'s' if files != 1 else ''}, {lines} line{'s' if lines != 1 else ''} read"
    verdict = "problems found (exit 1)" if errors else "no errors found (exit 0)"
    line.append(f" in {read} — {verdict}")
    return line
