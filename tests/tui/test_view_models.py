"""The TUI's pure parts, without an app: formatting, table rows, graphs, log filters, the poll thread."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from ddpdoctor.monitor.model.snapshot import CollectiveView, LogLine, RankState
from ddpdoctor.tui import fmt
from ddpdoctor.tui.graphs import build_graphs, graph_line
from ddpdoctor.tui.log_filter import LogFilter, parse_log_filter
from ddpdoctor.tui.messages import PollFailed, SnapshotReady
from ddpdoctor.tui.panels import split_frame, stacks_text
from ddpdoctor.tui.poller import SnapshotPoller, call_with_timeout
from ddpdoctor.tui.rank_detail import rank_detail_text
from ddpdoctor.tui.table_model import COLUMN_KEYS, SORT_ORDERS, build_model
from ddpdoctor.tui.view_model import ViewSettings, prepare_view
from tests.tui.canned import (
    FakeSource,
    crash_snapshot,
    hang_snapshot,
    healthy_snapshot,
    many_ranks_snapshot,
    rank_view,
)

pytestmark = pytest.mark.tui


def cells(row) -> dict[str, str]:
    return {key: text for key, (text, _style) in zip(COLUMN_KEYS, row.cells, strict=True)}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-1, "0.0s"), (0.42, "0.4s"), (12.4, "12s"), (245, "4m05s"), (7380, "2h03m")],
)
def test_duration(seconds, text):
    assert fmt.duration(seconds) == text


def test_small_formatters():
    assert fmt.clock(3725.9) == "1:02:05" and fmt.clock(None) == "-:--:--"
    assert fmt.step_seconds(0.2134) == "0.213s" and fmt.step_seconds(12.46) == "12.5s"
    assert fmt.rate(87.34) == "87.3" and fmt.rate(1234) == "1.2k" and fmt.rate(35_200) == "35k"
    assert fmt.loss(float("nan")) == "NaN" and fmt.loss(1.23456) == "1.2346"
    assert fmt.ranks_text([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and fmt.ranks_text([]) == "-"
    assert fmt.truncate("reduce_scatter_tensor", 10) == "reduce_sc…"
    assert fmt.steps(12, 100) == "12/100" and fmt.steps(12, None) == "12"


def test_progress_bar_has_fixed_width_and_eighths():
    assert fmt.progress_bar(0, 100, 10) == "░" * 10
    assert fmt.progress_bar(100, 100, 10) == "█" * 10
    assert fmt.progress_bar(55, 100, 10) == "█████▌░░░░"
    assert fmt.progress_bar(5, None, 4) == "    "  # total unknown: blank, same width
    assert all(len(fmt.progress_bar(d, 37, 10)) == 10 for d in range(0, 40))


def test_sparkline_uses_one_shared_scale():
    fast = fmt.sparkline([0.1, 0.1, 0.1], 3, low=0.0, high=0.2)
    slow = fmt.sparkline([0.2, 0.2, 0.2], 3, low=0.0, high=0.2)
    assert fast == "▅▅▅" and slow == "███"  # the straggler draws taller, not the same
    assert fmt.sparkline([1, 2, 3], 6, low=0, high=3) == "▃▆█   "
    # Only the latest values fit: 0..99 ends with 95..99, all at the top of the scale.
    assert fmt.sparkline([99.0] + [0.0] * 99, 5, low=0, high=99) == "▁▁▁▁▁"


def test_rank_rows_show_state_collective_and_culprit():
    model = build_model(hang_snapshot())
    assert not model.grouped
    assert [row.key for row in model.rows] == ["r0", "r1", "r2", "r3"]
    culprit, victim = cells(model.rows[1]), cells(model.rows[0])
    assert culprit["rank"] == "★ 1" and culprit["state"] == "stalled"
    assert victim["collective"] == "all_reduce #482" and victim["wait"] == "42s"
    assert victim["step"] == "120/200" and victim["progress"] == "██████░░░░"
    assert model.rows[1].cells[0][1] == fmt.CULPRIT_STYLE
    failed = cells(build_model(crash_snapshot()).rows[3])
    assert failed["collective"] == "RuntimeError: inj…"  # cut to the column, never widening it
    done = cells(build_model(healthy_snapshot()).rows[0])
    assert done["collective"] == "exit 0" and done["state"] == "done"


def test_every_sort_order_puts_the_interesting_rank_first():
    snap = hang_snapshot()
    snap = replace(
        snap,
        ranks=tuple(
            replace(rv, step=90, heartbeat_age_s=9.0, step_time_s=2.0, samples_per_s=1.0)
            if rv.rank == 2
            else rv
            for rv in snap.ranks
        ),
    )
    firsts = {o.column: build_model(snap, sort=o).rows[0].key for o in SORT_ORDERS}
    assert firsts == {
        "rank": "r0",
        "state": "r1",  # stalled beats waiting
        "step": "r2",
        "wait": "r0",  # waiting 41.5 s (ties broken by rank)
        "heartbeat": "r2",
        "step_time": "r2",
        "samples": "r2",
    }


def test_many_ranks_are_grouped_by_host_with_aggregates():
    snap = many_ranks_snapshot(world=128, per_host=8)
    ranks = list(snap.ranks)
    ranks[9] = replace(
        ranks[9],
        state=RankState.STALLED,
        step=50,
        collective=CollectiveView("all_reduce", 7, 33.0),
    )
    snap = replace(snap, ranks=tuple(ranks), culprits=frozenset({9}))
    model = build_model(snap)
    assert model.grouped and len(model.rows) == 16
    host = cells(model.rows[1])
    assert model.rows[1].key == "hnode-001"
    assert host["rank"] == "▸★node-001" and host["pid"] == "×8"
    assert host["state"] == "stalled 1/8"
    assert host["step"] == "50/200"  # the laggard's
    assert host["collective"] == "all_reduce #7" and host["wait"] == "33s"
    expanded = build_model(snap, expanded={"node-001"})
    keys = [row.key for row in expanded.rows]
    assert keys[1:10] == ["hnode-001", *(f"r{r}" for r in range(8, 16))]
    by_state = build_model(snap, sort=SORT_ORDERS[1])
    assert by_state.rows[0].key == "hnode-001"


def test_graphs_one_line_per_rank_and_the_straggler_stands_out():
    graphs = build_graphs(healthy_snapshot())
    assert [s.label for s in graphs.series] == ["r0", "r1", "r2", "r3"]
    lines = [graph_line(graphs, i, 100).plain for i in range(4)]
    work_bar = [line.split("work ")[1].split(" wait")[0] for line in lines]
    # Rank 2 did its step's work while the others waited: its work bar is the full one.
    assert work_bar[2].count("█") > 2 * max(work_bar[i].count("█") for i in (0, 1, 3))
    narrow = graph_line(graphs, 0, 40).plain
    assert "work" not in narrow and "0.210s" in narrow


def test_graphs_per_host_take_the_slowest_rank():
    snap = many_ranks_snapshot(world=128, per_host=8)
    ranks = list(snap.ranks)
    ranks[20] = replace(ranks[20], step_times=(0.9,) * 24)
    graphs = build_graphs(replace(snap, ranks=tuple(ranks)))
    assert len(graphs.series) == 16
    assert graphs.series[2].step_times == (0.9,) * 24 and graphs.high == 0.9
    assert graphs.series[1].culprit  # node-001 holds culprit rank 13


def test_prepared_view_matches_what_the_table_would_build():
    snap = many_ranks_snapshot(world=128)
    settings = ViewSettings(sort_index=2, expanded=frozenset({"node-003"}))
    prepared = prepare_view(snap, settings)
    assert prepared.table == build_model(snap, sort=SORT_ORDERS[2], expanded={"node-003"})
    assert prepared.graphs == build_graphs(snap)


@pytest.mark.parametrize(
    ("text", "ranks", "level"),
    [
        ("", None, "info"),
        ("3", {3}, "info"),
        ("0,2-3", {0, 2, 3}, "info"),
        ("warn", None, "warn"),
        ("rank 1-2 level error", {1, 2}, "error"),
        ("1 WARNINGS", {1}, "warn"),
    ],
)
def test_parse_log_filter(text, ranks, level):
    parsed = parse_log_filter(text)
    assert parsed.ranks == (frozenset(ranks) if ranks is not None else None)
    assert parsed.level == level
    assert parse_log_filter(parsed.text()) == parsed  # round trip for the prompt


@pytest.mark.parametrize("text", ["x", "3-1", "1-999999999", "rank=3"])
def test_parse_log_filter_rejects_nonsense(text):
    with pytest.raises(ValueError):
        parse_log_filter(text)


def test_log_filter_by_rank_and_level():
    lines = (
        LogLine("rank 0 stdout", "a", rank=0),
        LogLine("rank 1 stderr", "b", rank=1, level="warn"),
        LogLine("torchrun", "c", level="error"),
    )
    assert [x.text for x in LogFilter().apply(lines)] == ["a", "b", "c"]
    assert [x.text for x in LogFilter(level="warn").apply(lines)] == ["b", "c"]
    assert [x.text for x in LogFilter(frozenset({1})).apply(lines)] == ["b"]
    assert LogFilter(frozenset({1, 2}), "error").describe() == "rank 1-2, error and worse"
    assert LogFilter().next_level().next_level().next_level() == LogFilter()


def test_stack_frames_put_the_function_first_in_the_panel():
    assert split_frame("torch/distributed/c10d.py:2501 all_reduce") == (
        "all_reduce",
        "c10d.py:2501",
    )
    assert split_frame("clock_nanosleep (libc.so.6)") == ("clock_nanosleep (libc.so.6)", "")
    text = stacks_text(hang_snapshot()).plain
    assert "ranks 0,2-3 (3 ranks) · MainThread" in text
    assert "all_reduce  distributed_c10d.py:2501" in text
    assert "… 14 library frames (torch, torch/nn)" in text


def test_rank_detail_text_has_summary_stack_and_logs():
    crash = rank_detail_text(crash_snapshot(), 3).plain
    assert "culprit of the current diagnosis" in crash
    assert "traceback" in crash and "injected crash on rank 3" in crash
    assert "exit 1" in crash or "RuntimeError" in crash
    waiting = rank_detail_text(hang_snapshot(), 0).plain
    assert "all_reduce #482 of [2048] float32 for 42s" in waiting
    assert "waiting on  rank 1" in waiting
    assert "this rank is not in the snapshot" in rank_detail_text(hang_snapshot(), 9).plain


def test_poller_posts_snapshots_and_failures_in_order():
    posted: list = []
    source = FakeSource(hang_snapshot())
    poller = SnapshotPoller(source, posted.append, prepare=lambda s: ("prepared", s.verdict))
    poller.start()
    try:
        deadline = time.monotonic() + 10
        while not posted and time.monotonic() < deadline:
            time.sleep(0.01)
        source.fail_with = RuntimeError("disk gone")
        woken = time.monotonic()
        poller.wake()
        time.sleep(0.2)
        if time.monotonic() - woken < 1.0:  # well inside the 2 s ack timeout
            # One snapshot in flight: no new poll until the app has taken the last one.
            assert len(posted) == 1 and source.polls == 1
        poller.ack()
        while len(posted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        poller.stop()
    assert not poller.alive
    first, second = posted[:2]
    assert isinstance(first, SnapshotReady) and first.prepared == (
        "prepared",
        first.snapshot.verdict,
    )
    assert isinstance(second, PollFailed) and second.error == "RuntimeError: disk gone"
    assert second.serial > first.serial


def test_call_with_timeout_bounds_and_reraises():
    assert call_with_timeout(lambda: 42, 1.0, "answer") == 42
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0, "boom")
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"stuck did not finish within 0\.1 s"):
        call_with_timeout(lambda: release.wait(30), 0.1, "stuck")
    assert time.monotonic() - started < 5
    release.set()


def test_rank_view_defaults_are_sane():
    rv = rank_view(0)
    assert rv.state is RankState.RUNNING and rv.step_times


def test_the_title_line_names_what_started_the_ranks():
    from ddpdoctor.monitor.model.launchers import LauncherView
    from ddpdoctor.tui.header import title_line
    from tests.tui.canned import healthy_snapshot

    snap = healthy_snapshot()
    assert "started by" not in title_line(snap, None).plain
    one = replace(snap, launchers=(LauncherView("vm", 7, ("/v/python", "multigpu.py"), (0, 1)),))
    assert "· started by python multigpu.py │" in title_line(one, None).plain
    two = replace(one, launchers=one.launchers * 2)
    assert "· started by 2 launchers │" in title_line(two, None).plain


def test_a_wait_for_a_busy_rank_has_its_own_state_in_the_table_and_the_status_line():
    from ddpdoctor.tui.status import AppState, status_line
    from tests.unit.monitor.test_monitor_headless import _busy_wait

    snap = _busy_wait(20.0)
    rows = {row.rank: cells(row) for row in build_model(snap).rows}
    assert rows[1]["state"] == "wait r0 (busy)" and rows[0]["state"] == "busy"
    line = status_line(AppState(mode="run", snapshot=snap, job_attached=True)).plain
    assert "rank 1 waits 20 s for rank 0, busy in train.py:88 evaluate (CPU 99%)" in line


def test_rank_detail_says_what_the_rank_is_doing():
    from tests.unit.monitor.test_monitor_headless import _busy_wait

    text = rank_detail_text(_busy_wait(20.0), 0).plain
    assert "activity  busy in train.py:88 evaluate (CPU 99%) for 20s" in text
