"""The TUI shows job text (log lines, findings, errors, host names) with its terminal control
sequences escaped and its rich markup as text: nothing a job prints reaches the terminal as a
command (OSC 52 clipboard write, OSC 0 title, OSC 8 link, clear screen)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.model.snapshot import LogLine
from ddpdoctor.tui.app import DdpDoctorApp
from ddpdoctor.tui.rank_detail import RankDetailScreen
from tests.tui.canned import FakeJob, FakeSource, crash_snapshot
from tests.tui.helpers import first_snapshot, wait_until

pytestmark = [pytest.mark.tui, pytest.mark.timeout(60)]

EVIL = "\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x1b[2J\x9b2J [link=http://evil.example]x[/link]"


def evil_snapshot():
    snap = crash_snapshot()
    ranks = list(snap.ranks)
    ranks[3] = replace(ranks[3], error=f"RuntimeError: {EVIL}", host=f"vm{EVIL}")
    finding = Finding(
        id="python.exception",
        severity=Severity.ERROR,
        summary=f"rank 3 raised {EVIL}",
        fix=f"see {EVIL}",
        ranks=(3,),
        evidence=(Evidence(f"RuntimeError: {EVIL}", "logs/3/stderr.log", 2),),
    )
    line = LogLine("rank 3 stderr", f"RuntimeError: {EVIL}", rank=3, level="error")
    return replace(
        snap, ranks=tuple(ranks), findings=(finding, *snap.findings), logs=(*snap.logs, line)
    )


def assert_inert(text: str) -> None:
    for char in ("\x1b", "\x07", "\x9b"):
        assert char not in text, repr(text)


async def test_job_text_is_shown_escaped_in_every_view():
    app = DdpDoctorApp(FakeSource(evil_snapshot()), mode="run", job=FakeJob(), title=f"t{EVIL}")
    async with app.run_test(size=(160, 50)) as pilot:
        await first_snapshot(pilot)
        diagnosis = str(app.diagnosis.render())
        logs = app.logs.plain_text()
        for shown in (diagnosis, logs):
            assert_inert(shown)
            assert "\\x1b]52;c;ZXZpbA==" in shown
            assert "[link=http://evil.example]x[/link]" in shown  # markup shown as text
        assert_inert(app.table.get_cell("r3", "host").plain)
        screen = app.export_screenshot()
        assert_inert(screen)
        assert "\\x1b]52;c;ZXZpbA==" in screen
        app.table.move_cursor(row=3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RankDetailScreen), what="detail")
        await pilot.pause()
        assert_inert(app.export_screenshot())
