"""SVG snapshots of healthy, hang and crash runs at 80 and 160 columns (pytest-textual-snapshot).

The snapshots are canned (fixed times, pids and hosts) and the app reads no clock, so the pictures
are deterministic. Update them after a deliberate change with `pytest --snapshot-update tests/tui`.
"""

from __future__ import annotations

import pytest
from textual.widgets import Footer

from ddpdoctor.tui.app import DdpDoctorApp
from tests.tui.canned import (
    FakeJob,
    FakeSource,
    crash_snapshot,
    hang_snapshot,
    healthy_snapshot,
    many_ranks_snapshot,
    pipeline_hang_snapshot,
)
from tests.tui.helpers import first_snapshot, wait_until

pytestmark = [pytest.mark.tui, pytest.mark.timeout(60)]

SIZES = {"80": (80, 30), "160": (160, 45)}
CASES = {
    # A finished healthy run opened with `watch` (post-mortem); a live hang under `run`; a crash.
    "healthy": lambda: DdpDoctorApp(FakeSource(healthy_snapshot()), mode="watch"),
    "hang": lambda: DdpDoctorApp(FakeSource(hang_snapshot()), mode="run", job=FakeJob()),
    "crash": lambda: DdpDoctorApp(FakeSource(crash_snapshot()), mode="watch"),
}


async def settle(pilot) -> None:
    await first_snapshot(pilot)
    footer = pilot.app.query_one(Footer)
    await wait_until(pilot, lambda: len(footer.children) > 0, what="the footer's keys")
    await pilot.pause()


@pytest.mark.parametrize("width", SIZES)
@pytest.mark.parametrize("case", CASES)
def test_screen(snap_compare, case: str, width: str):
    assert snap_compare(CASES[case](), terminal_size=SIZES[width], run_before=settle)


def test_many_ranks_grouped_by_host(snap_compare):
    app = DdpDoctorApp(FakeSource(many_ranks_snapshot(world=1024, per_host=8)), mode="watch")
    assert snap_compare(app, terminal_size=SIZES["160"], run_before=settle)


def test_pipeline_stages_and_who_waits_for_whom(snap_compare):
    app = DdpDoctorApp(FakeSource(pipeline_hang_snapshot()), mode="run", job=FakeJob())
    assert snap_compare(app, terminal_size=SIZES["160"], run_before=settle)
