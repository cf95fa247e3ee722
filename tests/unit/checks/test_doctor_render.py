"""The doctor's text report: symbols, fixes under warnings and failures, the summary line."""

from __future__ import annotations

import io

from rich.console import Console

from ddpdoctor.checks.model import CheckOutcome, Status
from ddpdoctor.checks.registry import Check
from ddpdoctor.checks.render import render_report
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.console import (
    ASCII_SYMBOLS,
    UNICODE_SYMBOLS,
    make_console,
    stream_is_unicode,
    symbols_for,
)


def _report(*outcomes: tuple[str, CheckOutcome], strict: bool = False) -> DoctorReport:
    from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes

    ctx = CheckContext(env={}, options=DoctorOptions(), probes=Probes())
    results = [Check(cid, cid.title(), lambda _c, o=o: o)(ctx) for cid, o in outcomes]
    return DoctorReport.build(results, strict=strict)


REPORT = _report(
    ("network.port", CheckOutcome(Status.FAIL, "port 29500 is in use by pid 42", fix="kill 42")),
    ("network.addr", CheckOutcome(Status.PASS, "resolves", details=("127.0.0.1",))),
    ("system.shm", CheckOutcome(Status.WARN, "64 MiB free", fix="--shm-size=8g", details=("d1",))),
    ("system.cpu", CheckOutcome(Status.SKIP, "not needed")),
)


def render(report: DoctorReport, *, terminal: bool, verbose: bool = False, ascii: bool = False):
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, color_system=None, width=60)
    symbols = ASCII_SYMBOLS if ascii else UNICODE_SYMBOLS
    render_report(report, console, verbose=verbose, symbols=symbols)
    return out.getvalue()


def test_plain_output_groups_results_and_shows_fixes():
    text = render(REPORT, terminal=False)
    lines = text.splitlines()
    assert "Network" in lines and "System" in lines
    assert "  ✗ Network.Port: port 29500 is in use by pid 42" in lines
    assert "      fix: kill 42" in lines
    assert "      fix: --shm-size=8g" in lines
    assert all(line == line.rstrip() for line in lines), "no padding in logs"
    assert "d1" not in text, "details of warnings only with -v"
    assert lines[-1].startswith("Summary: 1 passed, 1 warning, 1 failed, 1 skipped")
    assert "problems found (exit 1" in lines[-1]


def test_verbose_shows_details_and_ascii_symbols():
    text = render(REPORT, terminal=False, verbose=True, ascii=True)
    assert "  x Network.Port" in text and "  ! System.Shm" in text and "  + Network.Addr" in text
    assert "d1" in text and "127.0.0.1" in text


def test_terminal_output_wraps_under_the_text_not_the_symbol():
    long = _report(("system.x", CheckOutcome(Status.WARN, "word " * 30, fix="do it")))
    lines = render(long, terminal=True).splitlines()
    body = [line for line in lines if "word" in line]
    assert len(body) > 1
    assert all(line.startswith("    ") for line in body[1:]), body


def test_strict_summary_says_warnings_fail():
    report = _report(("system.shm", CheckOutcome(Status.WARN, "small", fix="grow it")), strict=True)
    assert "warnings fail under --strict" in render(report, terminal=False).splitlines()[-1]


def test_ascii_fallback_and_plain_console():
    latin = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    assert not stream_is_unicode(latin) and symbols_for(latin) is ASCII_SYMBOLS
    console = make_console(io.StringIO())
    assert console.width == 200 and not console.is_terminal
