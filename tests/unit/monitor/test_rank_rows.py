"""Rows: node 1's routine rank reaches node 0 as its state (ddpdoctor.monitor.follow.rank_rows), not
as its events, and node 0 sees it as it would from the rank's own file; a rank that stops being
routine, or whose row cannot be read, is read from its events again."""

from __future__ import annotations

import json

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.rank_rows import rows_of
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import RankState, RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.node_summary import read_node_summary
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import train
from tests.unit.monitor.test_node_summaries import KW, publish, two_nodes

# What a rank's view says of its progress and calls (its ages are as of the view: left out),
# and its times, which a row carries to a tenth of a millisecond.
COMPARED = (
    "host",
    "pid",
    "local_rank",
    "phase",
    "step",
    "epoch",
    "loss",
    "step_time_s",
    "data_time_s",
    "compute_time_s",
    "comm_wait_s",
    "collectives_done",
    "last_event",
    "group_seqs",
    "warnings",
    "avg_data_time_s",
    "avg_compute_time_s",
    "avg_comm_wait_s",
    "avg_steps",
    "calls_key",
    "reports_progress",
    "state",
)
TIMES = ("last_event_t", "last_progress_t", "last_heartbeat_t")


def busy(w, clock, seconds: int, cpu0: float = 0.0) -> None:
    """Heartbeats with progress facts: rank 1 busy at one core."""
    for i in range(seconds):
        clock.t += 1.0
        w.ev(1, "heartbeat", cpu_s=cpu0 + i + 1.0, frame="train.py:40 step", where="train.py:40")


def from_files(run: RunDir, now: float):
    """Every rank's view as its own event file tells, read whole (no summaries)."""
    state = RunState(RunInfo(name="x", run_dir=str(run.path), world_size=2))
    for rank in (0, 1):
        for line in run.events_file(rank).read_text().splitlines():
            state.apply(json.loads(line))
    return state.snapshot(now, hang_after=30.0)


def rowed(tmp_path):
    run, clock, w = two_nodes(tmp_path)
    w.ev(1, "warning", code="sampler.missing", message="no DistributedSampler")
    seq = train(w, clock, 4)
    busy(w, clock, 3)
    follower = Monitor(run, node_rank=1, clock=clock, **KW)
    lead = Monitor(run, node_rank=0, clock=clock, hang_after=30.0, **KW)
    follower.poll()
    lead.poll()  # its hello, from the whole digest
    seq = train(w, clock, 3, seq)
    busy(w, clock, 2, 3.0)
    publish(follower, clock)
    return run, clock, w, follower, lead, seq


def test_a_routine_rank_comes_as_a_row_and_reads_as_its_events(tmp_path):
    run, clock, _w, _follower, lead, seq = rowed(tmp_path)
    summary = read_node_summary(run, 1)
    assert summary is not None and summary.ranks == () and summary.row_ranks() == [1]
    snap = lead.poll()
    assert lead.merge.rowed == {1} and lead.merge.feed.seen[1].ranks == (1,)
    # the calls its node's previous write named count; those first named by this one, once a
    # later write bears them out (row_claims)
    assert [c.seq for c in snap.ranks[1].recent_collectives] == [1, 2, 3, 4]
    publish(_follower, clock)
    snap = lead.poll()
    mine, truth = snap.ranks[1], from_files(run, clock.t).ranks[1]
    assert mine.step == seq == 7
    assert {k: getattr(mine, k) for k in COMPARED} == {k: getattr(truth, k) for k in COMPARED}
    for k in TIMES:
        assert abs(getattr(mine, k) - getattr(truth, k)) <= 0.5e-4, k
    calls = [(c.op, c.seq, c.shapes, c.dtypes) for c in mine.recent_collectives]
    assert calls == [(c.op, c.seq, c.shapes, c.dtypes) for c in truth.recent_collectives]
    # its activity as its own node judged it, from every heartbeat
    assert mine.activity is not None and mine.activity.where == "train.py:40"
    assert truth.activity is not None and mine.activity.state is truth.activity.state


def test_a_rank_of_another_node_keeps_its_view_until_its_row_or_its_state_changes(tmp_path):
    _run, clock, w, follower, lead, seq = rowed(tmp_path)
    first = lead.poll().ranks[1]
    clock.t += 0.5
    assert lead.poll().ranks[1] is first  # nothing new of it: the same view
    seq = train(w, clock, 1, seq)
    publish(follower, clock)
    second = lead.poll().ranks[1]
    assert second is not first and second.step == seq
    assert lead.poll().ranks[1] is second
    lead.state.set_alive(1, True)  # (as a watcher on its host would find it)
    alive = lead.state.snapshot(clock.t, hang_after=30.0).ranks[1]
    assert alive is not second and alive.alive is True and alive.step == seq
    lead.state.set_alive(1, None)
    second = lead.poll().ranks[1]
    # node 1's launcher stops publishing and the rank falls silent: node 0's clock decides
    clock.t += 3.0
    snap = lead.poll()
    assert snap.ranks[1].state is RankState.STALLED and snap.ranks[1] is not second


def test_a_rank_that_fails_goes_back_to_its_events(tmp_path):
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    w.ev(1, "error", exc_type="RuntimeError", message="boom", traceback="Traceback ...")
    w.ev(1, "exit", code=1, reason="exception")
    publish(follower, clock)
    summary = read_node_summary(run, 1)
    assert summary is not None and [r.rank for r in summary.ranks] == [1]
    snap = lead.poll()
    assert lead.merge.rowed == set() and lead.merge.via == {1: 1}
    view = snap.ranks[1]
    assert view.state is RankState.FAILED and view.error == "RuntimeError: boom"
    assert view.step == seq and dict(view.warnings) == {"sampler.missing": "no DistributedSampler"}
    assert snap.verdict is Verdict.RUNNING  # told once node 1 covers the time (node_coverage)
    publish(follower, clock)
    publish(follower, clock)
    assert lead.poll().verdict is Verdict.CRASH


def test_a_rank_started_again_is_read_from_its_events_first(tmp_path):
    _run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    w.ev(1, "hello", local_rank=0, world_size=2, host="nodeB", pid=7001, ppid=4_190_001)
    w.ev(1, "phase", phase="train")
    train(w, clock, 2, seq)
    publish(follower, clock)
    publish(follower, clock)
    view = lead.poll().ranks[1]
    assert view.pid == 7001 and view.step == seq + 2


def test_a_row_that_cannot_be_read_leaves_the_rank_to_its_digest(tmp_path):
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    seq = train(w, clock, 1, seq)
    publish(follower, clock)
    path = run.node_dir(1) / "summary.json"
    head, _, rest = path.read_bytes().partition(b"\n")
    data = json.loads(head)
    data["rows"]["same"]["recent"] = [999]  # a call the table does not have
    data["rows"]["same"]["step"] = "eight"  # and a value of the wrong kind
    path.write_bytes(json.dumps(data).encode() + b"\n" + rest)
    snap = lead.poll()
    assert snap.ranks[1].step == seq  # its events, from the whole digest
    assert lead.merge.rowed == set()
    data["rows"] = {"rank": "all of them"}
    path.write_bytes(json.dumps(data).encode() + b"\n" + rest)
    lead.poll()  # rows that are not rows: nothing applied, nothing raised
    seq = train(w, clock, 1, seq)
    publish(follower, clock)
    head, _, rest = path.read_bytes().partition(b"\n")
    data = json.loads(head)
    assert data["rows"]["rank"] == [1]
    data["calls"] = [["all_reduce", ["not", "a", "group"], {"seq": 1}, 0, 0, "[]"], "x", []]
    path.write_bytes(json.dumps(data).encode() + b"\n" + rest)
    assert lead.poll().ranks[1].step == seq  # a call table that is none: its events instead


def test_calls_that_differ_across_nodes_are_a_mismatch_through_the_rows(tmp_path):
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    for rank, shape in ((0, [10]), (1, [20])):
        w.ev(rank, "collective_start", op="all_reduce", seq=seq + 1, group="default",
             shapes=[shape], dtypes=["float32"])  # fmt: skip
    clock.t += 0.5
    w.ev(1, "heartbeat", cpu_s=10.0)
    publish(follower, clock)
    assert read_node_summary(run, 1).row_ranks() == [1]  # type: ignore[union-attr]
    assert lead.poll().verdict is Verdict.RUNNING  # node 1's word alone: not compared yet
    publish(follower, clock)
    # its next write bears the call out (row_claims): compared, held until node 1 covers the time
    assert lead.poll().verdict is Verdict.RUNNING
    publish(follower, clock)
    publish(follower, clock)
    snap = lead.poll()
    assert snap.verdict is Verdict.MISMATCH
    assert f"#{seq + 1}" in snap.findings[0].summary and "[20]" in snap.findings[0].summary


def test_calls_that_differ_within_a_node_send_those_ranks_events():
    trackers = {r: RankTracker(r) for r in range(3)}
    for rank, tracker in trackers.items():
        tracker.apply({"rank": rank, "kind": "hello", "t": 1.0, "pid": 100 + rank})
        shape = [[20]] if rank == 2 else [[10]]
        tracker.apply({"rank": rank, "kind": "collective_start", "t": 2.0, "op": "all_reduce",
                       "seq": 1, "group": "default", "shapes": shape})  # fmt: skip
    _, rows = rows_of(trackers, range(3))
    assert rows == {}  # the node's ranks disagree at #1: events for each, to be compared
    _, rows = rows_of(trackers, (0, 1))  # the two that agree
    assert sorted(rows) == [0, 1]


def test_a_view_that_stands_has_the_state_the_clock_would_give_it(tmp_path):
    """_steady_until mirrors _state: up to the time it names, the state of a rank whose record
    did not change is the one its view was made with, for each steady state and threshold."""
    from ddpdoctor.monitor.model.rank_views import _steady_until

    state = RunState(RunInfo(name="x", run_dir=str(tmp_path), world_size=1))
    base = [
        {"kind": "hello", "t": 100.0, "pid": 1},
        {"kind": "phase", "t": 100.0, "phase": "train"},
    ]
    cases = {
        "starting": [{"kind": "heartbeat", "t": 104.5}],
        "running": [{"kind": "step", "t": 102.0, "step": 1}, {"kind": "heartbeat", "t": 104.5}],
        "in a collective": [
            {"kind": "step", "t": 102.0, "step": 1},
            {"kind": "collective_start", "t": 104.5, "op": "all_reduce", "seq": 1},
            {"kind": "heartbeat", "t": 104.5},
        ],
        "no heartbeat": [{"kind": "step", "t": 104.5, "step": 1}],
    }
    checked: set[tuple[str, RankState]] = set()
    for hang_after in (2.0, 5.0, 30.0):
        th = state.thresholds(hang_after)
        for name, events in cases.items():
            tracker = RankTracker(0)
            for event in (base[:1] if name == "starting" else base) + events:
                tracker.apply({"rank": 0, **event})
            made = state._state(tracker, 105.0, True, th)[0]
            if made not in (RankState.STARTING, RankState.RUNNING, RankState.IN_COLLECTIVE):
                continue  # (stalled, waiting: not a state a view stands in)
            checked.add((name, made))
            until = _steady_until(tracker, th)  # (earlier than needed is allowed: made again)
            if hang_after == 30.0 and name != "starting":
                assert until >= 105.0 + min(th.heartbeat_stale_s, th.waiting_after_s) - 1.0
            for step in range(1, 2000):
                now = 105.0 + step * 0.05
                if now >= until:
                    break
                assert state._state(tracker, now, True, th)[0] is made, (name, hang_after, now)
    assert {made for _, made in checked} == {
        RankState.STARTING,
        RankState.RUNNING,
        RankState.IN_COLLECTIVE,
    }
