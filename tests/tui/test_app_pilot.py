"""The app driven headless with Pilot: keys, selection, detail, panels, filters, sort, stacks, quit."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from textual.notifications import Notify
from textual.widgets import Input

from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.tui import fmt
from ddpdoctor.tui.app import DdpDoctorApp
from ddpdoctor.tui.dialogs import LogFilterScreen, QuitRunScreen
from ddpdoctor.tui.messages import SnapshotReady
from ddpdoctor.tui.panels import diagnosis_text
from ddpdoctor.tui.rank_detail import RankDetailScreen
from ddpdoctor.tui.ranks_table import RanksTable
from tests.tui.canned import (
    RUN,
    T0,
    FakeJob,
    FakeSource,
    crash_snapshot,
    hang_snapshot,
    healthy_snapshot,
    many_ranks_snapshot,
)
from tests.tui.helpers import first_snapshot, wait_until

pytestmark = [pytest.mark.tui, pytest.mark.timeout(60)]

SIZE = (120, 40)


def row_keys(app: DdpDoctorApp) -> list[str]:
    return [row.key.value for row in app.table.ordered_rows]


def plain(widget) -> str:
    """The text a Static-like view currently shows."""
    return str(widget.render())


def notifications(messages: list) -> list[str]:
    return [
        f"{m.notification.title}: {m.notification.message}"
        for m in messages
        if isinstance(m, Notify)
    ]


async def test_first_snapshot_fills_every_view():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="run", job=FakeJob())
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert row_keys(app) == ["r0", "r1", "r2", "r3"]
        assert app.table.get_cell("r1", "state").plain == "stalled"
        assert app.table.get_cell("r1", "rank").plain.startswith("★")  # the culprit
        assert app.table.get_cell("r0", "collective").plain == "all_reduce #482"
        assert "HANG" in str(app.header.render().columns[1]._cells[0])
        assert "hang.culprit" in plain(app.diagnosis)
        assert "fix:" in plain(app.diagnosis)
        assert "ranks 0,2-3 (3 ranks)" in plain(app.stacks)
        assert "injecting hang on rank 1" in app.logs.plain_text()


async def test_select_a_rank_and_open_its_detail():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RankDetailScreen), what="detail")
        body = str(app.screen.query_one("#rank-detail-body").render())
        assert "rank 1" in body and "culprit of the current diagnosis" in body
        assert "hang_forever" in body  # its stack
        assert "injecting hang on rank 1" in body  # its log lines
        assert "fault hang" in body  # its events summary: last event
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, RankDetailScreen), what="close")
        assert app.table.selected_key() == "r1"


async def test_detail_follows_new_snapshots():
    source = FakeSource(hang_snapshot())
    app = DdpDoctorApp(source, mode="watch", refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("enter")  # rank 0
        await wait_until(pilot, lambda: isinstance(app.screen, RankDetailScreen))
        snap = hang_snapshot()
        source.snapshot = replace(
            snap,
            ranks=tuple(
                replace(rv, last_event="step 999") if rv.rank == 0 else rv for rv in snap.ranks
            ),
        )
        await wait_until(
            pilot,
            lambda: "step 999" in str(app.screen.query_one("#rank-detail-body").render()),
            what="the detail to follow the snapshot",
        )


async def test_panel_toggles():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        for key, panel in (
            ("g", "#graphs-panel"),
            ("d", "#diagnosis-panel"),
            ("k", "#stacks-panel"),
            ("l", "#logs-panel"),
        ):
            widget = app.query_one(panel)
            assert widget.display
            await pilot.press(key)
            assert not widget.display, panel
            await pilot.press(key)
            assert widget.display, panel


async def test_log_filters_by_rank_and_level():
    app = DdpDoctorApp(FakeSource(crash_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "torchrun" in app.logs.plain_text()
        await pilot.press("f")
        await wait_until(pilot, lambda: isinstance(app.screen, LogFilterScreen))
        prompt = app.screen.query_one(Input)
        prompt.value = "bogus"
        await pilot.press("enter")
        assert isinstance(app.screen, LogFilterScreen)  # a bad filter keeps the prompt open
        assert "neither a rank" in str(app.screen.query_one("#filter-error").render())
        prompt.value = ""
        await pilot.press("3", "enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, LogFilterScreen))
        text = app.logs.plain_text()
        assert "injected crash on rank 3" in text
        assert "Connection closed by peer" not in text and "torchrun" not in text
        assert app.query_one("#logs-panel").border_title == "logs · rank 3"
        # w cycles the level: warn and worse, error only, everything.
        await pilot.press("w")
        assert app.logs.log_filter.level == "warn"
        await pilot.press("w")
        assert app.logs.log_filter.level == "error"
        assert "injected crash on rank 3" in app.logs.plain_text()
        await pilot.press("w")
        assert app.logs.log_filter.level == "info"


async def test_level_filter_hides_info_lines():
    app = DdpDoctorApp(FakeSource(healthy_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "loss 1.2401" in app.logs.plain_text()
        await pilot.press("w")
        text = app.logs.plain_text()
        assert "loss 1.2401" not in text
        assert "find_unused_parameters" in text
        assert "◆ ddp.find_unused_parameters" in text  # the explainer's mark


async def test_r_filters_logs_to_the_selected_rank_and_back():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("down", "r")
        assert app.logs.log_filter.ranks == frozenset({1})
        assert "step 100 loss 1.2401" not in app.logs.plain_text()  # rank 0's line
        await pilot.press("r")
        assert app.logs.log_filter.ranks is None


async def test_sort_cycles_columns_and_keeps_the_selection():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("down", "down")  # rank 2 selected
        await pilot.press("s")  # worst state first: the stalled rank 1
        assert app.table.current_sort.column == "state"
        assert row_keys(app)[0] == "r1"
        assert "worst state" in app.table.border_title
        assert app.table.selected_key() == "r2"
        for _ in range(6):  # through every order and back to rank
            await pilot.press("s")
        assert app.table.current_sort.column == "rank"
        assert row_keys(app) == ["r0", "r1", "r2", "r3"]


async def test_table_is_updated_cell_by_cell_not_rebuilt(monkeypatch):
    source = FakeSource(hang_snapshot())
    app = DdpDoctorApp(source, mode="watch", refresh_s=0.05)
    calls: list[tuple] = []
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        table = app.table
        for name in ("update_cell", "add_row", "remove_row", "clear"):
            original = getattr(table, name)

            def spy(*args, _name=name, _original=original, **kwargs):
                calls.append((_name, args[:2]))
                return _original(*args, **kwargs)

            monkeypatch.setattr(table, name, spy)
        snap = hang_snapshot()
        source.snapshot = replace(
            snap,
            ranks=tuple(
                replace(rv, heartbeat_age_s=2.5) if rv.rank == 3 else rv for rv in snap.ranks
            ),
        )
        await wait_until(pilot, lambda: table.get_cell("r3", "heartbeat").plain == "2.5s")
        assert calls == [("update_cell", ("r3", "heartbeat"))]
        assert row_keys(app) == ["r0", "r1", "r2", "r3"]


async def test_capture_stacks_key_calls_the_source_off_the_event_loop():
    source = FakeSource(hang_snapshot())
    app = DdpDoctorApp(source, mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        app.query_one("#stacks-panel").display = False
        await pilot.press("c")
        await wait_until(pilot, lambda: source.stack_requests == 1, what="request_stacks")
        assert source.stack_thread != threading.main_thread().name
        assert app.query_one("#stacks-panel").display  # shown where the stacks will appear


async def test_a_stuck_or_failing_stack_capture_is_shown_not_fatal():
    class StuckSource(FakeSource):
        def request_stacks(self) -> None:
            threading.Event().wait(30)

    class BrokenSource(FakeSource):
        def request_stacks(self) -> None:
            raise RuntimeError("py-spy: Permission denied (os error 1)")

    class BusySource(FakeSource):
        def request_stacks(self) -> bool:
            return False  # as Monitor.request_stacks answers while a capture runs

    for source, expected, title in (
        (StuckSource(hang_snapshot()), "did not finish within 0.2 s", "Stack capture failed"),
        (BrokenSource(hang_snapshot()), "py-spy: Permission denied", "Stack capture failed"),
        (BusySource(hang_snapshot()), "A capture is already running", ""),
    ):
        seen: list = []
        app = DdpDoctorApp(source, mode="watch")
        app.stacks_timeout_s = 0.2
        async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
            await first_snapshot(pilot)
            await pilot.press("c")
            await wait_until(
                pilot,
                lambda seen=seen, expected=expected: any(
                    expected in n for n in notifications(seen)
                ),
            )
            assert any(n.startswith(title) and expected in n for n in notifications(seen))
            assert app.is_running and app.note is None


async def test_quit_in_run_mode_asks_then_stops_the_job():
    job = FakeJob()
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="run", job=job)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitRunScreen), what="the question")
        assert job.stops == 0
        await pilot.press("escape")  # keep watching
        await wait_until(pilot, lambda: not isinstance(app.screen, QuitRunScreen))
        assert job.stops == 0 and app.is_running
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitRunScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: job.stops == 1, what="job.stop()")
    assert job.stop_thread != threading.main_thread().name
    assert app.return_value is not None and app.return_value.verdict.value == "hang"


async def test_ctrl_q_in_run_mode_also_asks():
    job = FakeJob()
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="run", job=job)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitRunScreen))
        await pilot.click("#quit-stop")
        await wait_until(pilot, lambda: job.stops == 1)


async def test_quit_in_watch_mode_leaves_the_job_alone():
    job = FakeJob()
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch", job=job)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, what="exit")
    assert job.stops == 0
    assert app.return_value is not None


async def test_run_mode_after_the_job_ended_keeps_the_state_and_quits_without_asking():
    job = FakeJob(returncode=1)
    seen: list = []
    app = DdpDoctorApp(FakeSource(crash_snapshot()), mode="run", job=job)
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await first_snapshot(pilot)
        status = app.header.status.plain
        assert "the job has ended (exit code 1): crash" in status
        assert "final state kept on screen" in status
        assert any(n.startswith("Job ended") for n in notifications(seen))
        assert app.table.get_cell("r3", "state").plain == "failed"
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running)
    assert job.stops == 0


async def test_a_node_awaited_then_never_joined():
    """A job over two nodes whose second launcher never started: the status names the node while
    it is awaited; once torchrun gave up, the badges say NOT STARTED."""
    waiting = Snapshot(run=replace(RUN, nnodes=2), taken_t=T0 + 9.0, ranks=(), nodes_missing=(1,))
    app = DdpDoctorApp(FakeSource(waiting), mode="run", job=FakeJob())
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "live · waiting for node 1 to join" in app.header.status.plain
    over = replace(waiting, live=False, finished=True)
    assert over.verdict is Verdict.RUNNING and over.never_started
    app = DdpDoctorApp(FakeSource(over), mode="run", job=FakeJob(returncode=1))
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "the job has ended (exit code 1): not started" in app.header.status.plain
    assert fmt.verdict_badge(over).plain == " NOT STARTED "
    assert diagnosis_text(over).plain.startswith(" NOT STARTED ")


async def test_run_mode_says_when_ddpdoctor_stopped_the_job():
    source = FakeSource(hang_snapshot())
    source.stopped_for = "hang"
    app = DdpDoctorApp(source, mode="run", job=FakeJob(returncode=-15))
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        status = app.header.status.plain
        assert "the job has ended (killed by SIGTERM): hang" in status
        assert "ddpdoctor stopped it after the hang" in status


async def test_watch_of_a_finished_run_is_a_post_mortem():
    app = DdpDoctorApp(FakeSource(healthy_snapshot()), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "post-mortem: the run has finished: healthy" in app.header.status.plain
        assert "No problems found." in plain(app.diagnosis)


async def test_a_failing_source_is_shown_and_polling_goes_on():
    source = FakeSource(
        hang_snapshot(), fail_with=OSError("events/rank-1.jsonl: Input/output error")
    )
    seen: list = []
    app = DdpDoctorApp(source, mode="watch", refresh_s=0.05)
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await wait_until(pilot, lambda: app.poll_error is not None, what="the poll error")
        assert "OSError: events/rank-1.jsonl: Input/output error" in app.header.status.plain
        assert any("could not update the view" in n for n in notifications(seen))
        polls = source.polls
        await wait_until(pilot, lambda: source.polls > polls + 2, what="more polls")
        # One notification for one repeated error, not one per poll.
        assert sum("could not update the view" in n for n in notifications(seen)) == 1
        source.fail_with = None
        await first_snapshot(pilot)
        assert app.poll_error is None and "reading the run failed" not in app.header.status.plain
        assert row_keys(app) == ["r0", "r1", "r2", "r3"]


async def test_a_snapshot_the_views_cannot_show_is_reported_not_fatal():
    class Odd:
        value = "odd"  # a verdict and a state this version of the app does not know

    source = FakeSource(hang_snapshot())
    app = DdpDoctorApp(source, mode="watch", refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        snap = hang_snapshot()
        source.snapshot = replace(
            snap, verdict=Odd(), ranks=(replace(snap.ranks[0], state=Odd()), *snap.ranks[1:])
        )
        await wait_until(pilot, lambda: app.table.get_cell("r0", "state").plain == "odd")
        assert "ODD" in str(app.diagnosis.render())
        source.snapshot = replace(snap, ranks=(None, *snap.ranks[1:]))  # broken beyond showing
        await wait_until(pilot, lambda: app.poll_error is not None, what="the error")
        assert app.poll_error.startswith("showing the run failed:")
        assert app.is_running
        source.snapshot = crash_snapshot()
        await wait_until(pilot, lambda: app.poll_error is None, what="recovery")
        assert app.table.get_cell("r3", "state").plain == "failed"


async def test_stale_snapshots_never_replace_newer_ones():
    app = DdpDoctorApp(FakeSource(hang_snapshot()), mode="watch", refresh_s=60)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        newer, older = crash_snapshot(), healthy_snapshot()
        app.post_message(SnapshotReady(newer, serial=100, job_returncode=None))
        app.post_message(SnapshotReady(older, serial=99, job_returncode=None))
        await wait_until(pilot, lambda: app.snapshot is newer)
        await pilot.pause(0.1)
        assert app.snapshot is newer
    # Latest wins: a queued snapshot is dropped for the newer one queued behind it, never the reverse.
    first = SnapshotReady(older, serial=1, job_returncode=None)
    second = SnapshotReady(newer, serial=2, job_returncode=None)
    assert first.can_replace(second) and not second.can_replace(first)


async def test_many_ranks_group_by_host_and_enter_expands_a_host():
    snap = many_ranks_snapshot(world=128, per_host=8)
    app = DdpDoctorApp(FakeSource(snap), mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        keys = row_keys(app)
        assert len(keys) == 16 and all(k.startswith("hnode-") for k in keys)
        assert app.table.get_cell("hnode-001", "rank").plain.startswith("▸★")  # holds culprit 13
        assert app.table.get_cell("hnode-001", "pid").plain == "×8"
        await pilot.press("down", "enter")  # expand node-001
        await wait_until(pilot, lambda: "r13" in row_keys(app), what="the host's ranks")
        keys = row_keys(app)
        assert keys[1] == "hnode-001" and keys[2:10] == [f"r{r}" for r in range(8, 16)]
        assert app.table.get_cell("hnode-001", "rank").plain.startswith("▾")
        await pilot.press("down", "enter")  # rank 8's detail
        await wait_until(pilot, lambda: isinstance(app.screen, RankDetailScreen))
        assert app.screen.rank == 8
        await pilot.press("escape")
        await pilot.press("up", "enter")  # collapse again
        await wait_until(pilot, lambda: "r13" not in row_keys(app))
        assert len(row_keys(app)) == 16
        # Rows inserted above the selection (another host expanded) do not move it.
        app.table.move_cursor(row=app.table.get_row_index("hnode-002"))
        app.table.toggle_host("node-000")
        assert app.table.selected_key() == "hnode-002" and "r7" in row_keys(app)


async def test_state_colours_and_ranks_table_reflect_new_states():
    source = FakeSource(hang_snapshot())
    app = DdpDoctorApp(source, mode="watch", refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        assert "yellow" in str(app.table.get_cell("r0", "state").style)  # waiting
        assert "dark_orange" in str(app.table.get_cell("r1", "state").style)  # stalled
        snap = hang_snapshot()
        source.snapshot = replace(
            snap,
            ranks=tuple(
                replace(rv, state=RankState.FAILED, error="RuntimeError: boom", collective=None)
                if rv.rank == 1
                else rv
                for rv in snap.ranks
            ),
        )
        await wait_until(pilot, lambda: app.table.get_cell("r1", "state").plain == "failed")
        assert "red" in str(app.table.get_cell("r1", "state").style)
        assert app.table.get_cell("r1", "collective").plain == "RuntimeError: boom"
        assert isinstance(app.table, RanksTable)


async def test_b_asks_the_ranks_for_their_flight_recorder_and_the_stacks_panel_shows_it():
    import json
    from pathlib import Path

    from ddpdoctor.protocol.flight_recorder import parse_dump

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder" / "hang-gloo"
    dumps = []
    for rank in (0, 1):
        answer = json.loads((fixture / f"rank-{rank}.json").read_text())
        dumps.append(parse_dump(answer["dump"], rank=rank, taken_t=answer["taken_t"]))

    class RecorderSource(FakeSource):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.asked: list[str] = []

        def request_flight_recorder(self) -> bool:
            self.asked.append(threading.current_thread().name)
            return True

    snapshot = replace(hang_snapshot(), flight_recorder=tuple(dumps), fr_status="asked 12:00:01")
    source = RecorderSource(snapshot)
    app = DdpDoctorApp(source, mode="watch")
    async with app.run_test(size=SIZE) as pilot:
        await first_snapshot(pilot)
        await pilot.press("b")
        await wait_until(pilot, lambda: len(source.asked) == 1, what="request_flight_recorder")
        assert source.asked[0] != threading.main_thread().name
        text = plain(app.stacks)
        assert "flight recorder (asked 12:00:01)" in text
        assert "rank 0: all_reduce #8 (float32[2372]) scheduled, not completed" in text
        assert "rank 1: all completed, last all_reduce #7" in text
