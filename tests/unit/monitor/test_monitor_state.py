from __future__ import annotations

from ddpdoctor.monitor.model.snapshot import RankState, RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.torchrun_logs import classify_log_path
from tests.unit.monitor.test_monitor_builders import NOW, Stream


def state_of(stream: Stream, *, nnodes=1) -> RunState:
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=stream.world, nnodes=nnodes))
    events = sorted((e for evs in stream.events.values() for e in evs), key=lambda e: e["t"])
    for n, event in enumerate(events, 1):
        state.apply(event, (f"events/rank-{event['rank']}.jsonl", n))
    return state


def test_healthy_run_to_the_end():
    s = Stream()
    s.hello()
    t = s.steps(5)
    for r in range(2):
        s.ev(r, t + 0.1, "exit", code=0, reason="normal")
    snap = state_of(s).snapshot(NOW + t + 0.2, live=True)
    assert [v.state for v in snap.ranks] == [RankState.DONE, RankState.DONE]
    assert snap.verdict is Verdict.HEALTHY and snap.finished
    view = snap.ranks[0]
    assert view.step == 5 and view.step_time_s == 0.1 and len(view.step_times) == 5
    assert view.seq_in("default") == 5 and view.collectives_done == 5
    assert view.avg_steps == 5 and abs(view.avg_compute_time_s - 0.08) < 1e-9


def test_running_in_collective_and_waiting_with_whom():
    s = Stream()
    s.hello()
    t = s.steps(3)
    s.collective(0, t, dur=None)  # rank 0 enters #4 and waits; rank 1 does not come
    s.heartbeats(
        0, t, t + 2.0, open={"op": "all_reduce", "seq": 4, "group": "default", "since_t": NOW + t}
    )
    s.heartbeats(1, t, t + 2.0, step=3, phase="train", open=None)
    state = state_of(s)
    early = state.snapshot(NOW + t + 0.3, live=True)
    assert early.ranks[0].state is RankState.IN_COLLECTIVE
    later = state.snapshot(NOW + t + 2.5, live=True)
    r0, r1 = later.ranks
    assert r0.state is RankState.WAITING and r0.waiting_on == (1,)
    assert r0.collective.describe() == "all_reduce #4 of [10] float32"
    assert abs(r0.collective.waiting_s - 2.5) < 1e-6
    assert r1.state is RankState.RUNNING and r1.heartbeat_age_s is not None


def test_no_progress_past_the_threshold_is_stalled():
    s = Stream()
    s.hello()
    t = s.steps(3)
    s.heartbeats(1, t, t + 8.0, step=3)
    snap = state_of(s).snapshot(NOW + t + 8.5, live=True, hang_after=5.0)
    assert snap.ranks[1].state is RankState.STALLED


def test_stopped_heartbeat_live_is_stalled_and_in_a_post_mortem_gone():
    s = Stream()
    s.hello()
    t = s.steps(3)
    s.heartbeats(0, t, t + 10.0, step=3)
    state = state_of(s)
    live = state.snapshot(NOW + t + 10.0, live=True)
    assert live.ranks[1].state is RankState.STALLED
    dead = state.snapshot(NOW + t + 10.0, live=False)
    assert dead.ranks[1].state is RankState.GONE and dead.ranks[1].failed_t is not None


def test_post_mortem_rank_without_exit_while_all_others_ended_is_gone():
    s = Stream()
    s.hello()
    t = s.steps(2)
    s.ev(
        0,
        t + 0.3,
        "error",
        exc_type="RuntimeError",
        message="Connection closed by peer",
        traceback="tb",
    )
    s.ev(0, t + 0.4, "exit", code=1, reason="exception")
    snap = state_of(s).snapshot(NOW + t + 0.4, live=False)
    assert snap.ranks[0].state is RankState.FAILED
    assert snap.ranks[1].state is RankState.GONE and snap.finished


def test_errors_exits_and_signals():
    s = Stream()
    s.hello()
    s.ev(
        0,
        1.0,
        "error",
        exc_type="ValueError",
        message="bad\nsecond line",
        traceback="Traceback...",
        fatal=True,
    )
    s.ev(1, 1.0, "error", exc_type="OSError", message="worker thread", thread="loader", fatal=False)
    s.ev(1, 2.0, "exit", code=-15, reason="signal")
    snap = state_of(s).snapshot(NOW + 2.0)
    r0, r1 = snap.ranks
    assert (
        r0.state is RankState.FAILED and r0.error == "ValueError: bad" and r0.failed_t == NOW + 1.0
    )
    assert r0.error_at[0] == "events/rank-0.jsonl"
    assert r1.state is RankState.FAILED and r1.exit_signal == "SIGTERM" and r1.error is None


def test_local_process_gone_without_exit_event():
    s = Stream()
    s.hello()
    s.steps(2)
    state = state_of(s)
    state.set_alive(1, False)
    view = state.snapshot(NOW + 1.0).ranks[1]
    assert view.state is RankState.GONE and view.alive is False


def test_unknown_kinds_fields_and_bad_types_are_ignored():
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "telemetry", whatever=[1, 2])
    s.ev(0, 1.1, "step", step="seven", loss="nan", step_time_s=None)
    s.ev(0, 1.2, "collective_start", op="all_reduce")  # no seq: ignored
    s.ev(0, 1.3, "heartbeat", step=True, open={"op": 3})
    snap = state_of(s).snapshot(NOW + 1.5)
    assert snap.ranks[0].step is None and snap.ranks[0].collective is None


def test_world_size_comes_from_events_when_run_json_lacks_it():
    s = Stream(world=3)
    s.hello()
    state = RunState(RunInfo(name="t", run_dir="/x"))
    for e in s.events[2]:
        state.apply(e)
    snap = state.snapshot(NOW + 1)
    assert len(snap.ranks) == 3 and snap.ranks[0].state is RankState.STARTING


def test_restarted_rank_starts_over():
    s = Stream()
    s.hello()
    s.steps(4)
    s.ev(1, 5.0, "hello", local_rank=1, world_size=2, host="node0", pid=9999)
    view = state_of(s).snapshot(NOW + 5.1).ranks[1]
    assert view.pid == 9999 and view.step is None and view.seq_in("default") == 0


def test_epoch_warning_and_fault_events():
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "epoch", epoch=0, batches=12, samples=96, shuffle=True, set_epoch_called=False)
    s.ev(0, 2.0, "warning", code="sampler.set_epoch_missing", message="no set_epoch")
    s.ev(1, 2.0, "fault", inject="hang:rank=1,step=5", fault="hang", step=5)
    r0, r1 = state_of(s).snapshot(NOW + 2.5).ranks
    assert r0.loader_batches == ((0, 12),)  # an epoch event without a loader id: loader 0
    assert r0.epoch_batches == 12 and r0.warnings == (
        ("sampler.set_epoch_missing", "no set_epoch"),
    )
    assert r1.fault == "hang:rank=1,step=5" and r1.last_event == "fault hang"


def test_batches_are_kept_per_loader_with_each_loader_s_latest_epoch():
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "epoch", epoch=0, batches=20, loader=1)
    s.ev(0, 2.0, "epoch", epoch=0, batches=8, loader=2)  # rank 0's evaluation loader
    s.ev(0, 3.0, "epoch", epoch=1, batches=19, loader=1)
    r0 = state_of(s).snapshot(NOW + 3.5).ranks[0]
    assert r0.loader_batches == ((1, 19), (2, 8)) and r0.epoch_batches == 19


def test_a_loader_iterated_inside_join_is_not_compared_but_its_epoch_counts():
    """Join evens ranks with more batches (runtime/join_hooks.py): such a loader's latest epoch
    is left out of the compared batches, not out of the rank's epoch."""
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "epoch", epoch=0, batches=4, loader=1, join=False)
    s.ev(0, 1.5, "epoch", epoch=0, batches=2, loader=2, join=False)  # an evaluation loader
    s.ev(1, 1.0, "epoch", epoch=0, batches=7, loader=1, join=True)
    s.ev(0, 2.0, "epoch", epoch=1, batches=4, loader=1, join=True)
    r0, r1 = state_of(s).snapshot(NOW + 2.5).ranks
    assert r0.loader_batches == ((2, 2),) and r0.epoch_batches == 4 and r0.epoch == 1
    assert r1.loader_batches == () and r1.epoch_batches == 7


def test_logs_are_mapped_to_ranks_classified_and_deduplicated():
    s = Stream()
    s.hello(host="vm")

    def classify(text):
        from types import SimpleNamespace

        if "Error" in text:
            return SimpleNamespace(level="error", finding_id="python.exception")
        return None

    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2, nnodes=1), classify=classify)
    for evs in s.events.values():
        for e in evs:
            state.apply(e)
    rank_src = classify_log_path(("logs", "vm", "none_x", "attempt_0", "1", "stderr.log"))
    nccl_src = classify_log_path(("nccl", "vm.4000.log"))
    agent_src = classify_log_path(("logs", "vm", "torchrun.log"))
    assert state.apply_log_lines(rank_src, [(1, "Traceback"), (2, "RuntimeError: boom")]) == 1
    state.apply_log_lines(nccl_src, [(1, "vm:4000:4000 [0] NCCL INFO ok")])
    state.apply_log_lines(agent_src, [(1, "[default1]:RuntimeError: boom"), (2, "agent line")])
    snap = state.snapshot(NOW + 1)
    texts = [(line.source, line.text) for line in snap.logs]
    assert ("rank 1 stderr", "RuntimeError: boom") in texts
    assert ("nccl vm.4000", "vm:4000:4000 [0] NCCL INFO ok") in texts
    assert not any(t.startswith("[default1]") for _, t in texts)  # torchrun's tee copy
    err = snap.ranks[1].error_lines[0]
    assert (err.file, err.line_no, err.finding_id, err.rank) == (
        "logs/vm/none_x/attempt_0/1/stderr.log",
        2,
        "python.exception",
        1,
    )
    assert next(line for line in snap.logs if line.source.startswith("nccl")).rank == 0


def test_torchrun_table_marks_a_killed_rank_gone_with_its_signal():
    from tests.unit.protocol.test_torchrun_logs import TABLE

    s = Stream()
    s.hello(host="vm")
    s.events[1][0]["pid"] = 8482
    state = state_of(s)
    agent_src = classify_log_path(("logs", "vm", "torchrun.log"))
    state.apply_log_lines(agent_src, list(enumerate(TABLE.splitlines(), 1)))
    view = state.snapshot(NOW + 1).ranks[1]
    assert view.state is RankState.GONE and view.exit_code == -9 and view.exit_signal == "SIGKILL"
    assert any(
        line.file == "logs/vm/torchrun.log" and line.line_no == 22 for line in view.error_lines
    )


def test_failed_collective_is_kept_for_the_post_mortem():
    s = Stream()
    s.hello()
    t = s.steps(2)
    s.ev(
        0,
        t,
        "collective_start",
        op="all_reduce",
        seq=3,
        group="default",
        shapes=[[10]],
        dtypes=["float32"],
    )
    s.ev(
        0,
        t + 9.0,
        "collective_end",
        op="all_reduce",
        seq=3,
        group="default",
        duration_s=9.0,
        ok=False,
        error="Connection closed by peer",
    )
    s.ev(0, t + 9.1, "error", exc_type="RuntimeError", message="Connection closed by peer")
    view = state_of(s).snapshot(NOW + t + 9.2).ranks[0]
    assert view.state is RankState.FAILED
    assert view.collective.seq == 3 and view.collective.waiting_s == 9.0


def test_point_to_point_does_not_move_the_group_sequence():
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "collective_start", op="send", seq=1, group="default", p2p=True, peer=1)
    view = state_of(s).snapshot(NOW + 1.5).ranks[0]
    assert view.seq_in("default") == 0 and view.collective.op == "send"


def test_mismatch_is_found_in_snapshots_built_from_events():
    from ddpdoctor.monitor.judge.rules import mismatch

    s = Stream(world=4)
    s.hello()
    t = s.steps(3)
    for r in (0, 1, 2):
        s.collective(r, t, dur=None)
    s.collective(3, t, op="barrier", dur=None, shapes=[], dtypes=[])
    snap = state_of(s).snapshot(NOW + t + 1)
    keys = {v.calls_key for v in snap.ranks}
    assert len(keys) == 2 and 0 not in keys  # ranks 0-2 share their latest calls
    out = mismatch.detect(snap)
    assert out is not None and out.culprits == {3}
    assert "ranks 0-2: all_reduce #4 of [10] float32" in out.findings[0].summary


def test_views_are_frozen_and_compare_like_any_dataclass():
    import dataclasses

    import pytest

    s = Stream()
    s.hello()
    state = state_of(s)
    a, b = state.snapshot(NOW + 1).ranks[0], state.snapshot(NOW + 1).ranks[0]
    assert a == b and a.step is None and a.total_steps is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.step = 3
    assert dataclasses.replace(a, step=3).step == 3


def test_a_view_is_made_again_when_its_rank_changes_and_only_then():
    from ddpdoctor.monitor.model.snapshot import LogLine

    s = Stream()
    s.hello()
    t = s.steps(3)
    s.heartbeats(0, t, t + 0.1, step=3, phase="train", open=None)
    state = state_of(s)
    first = state.snapshot(NOW + t + 0.2).ranks[0]
    again = state.snapshot(NOW + t + 0.7).ranks[0]
    assert again.heartbeat_age_s != first.heartbeat_age_s  # what time changes, every snapshot
    assert again.recent_collectives is first.recent_collectives  # what only events change: kept
    line = LogLine("rank 0 stderr", "RuntimeError: boom", 0, "error")
    state.ranks[0].add_error_line(line)  # a log line, no event
    assert state.snapshot(NOW + t + 0.8).ranks[0].error_lines == (line,)
    state.apply({"v": 1, "t": NOW + t + 0.8, "rank": 0, "kind": "step", "step": 4}, None)
    assert state.snapshot(NOW + t + 0.9).ranks[0].step == 4
    state.restart_rank(0)  # read again from its start: a fresh record, no view of the old one
    assert state.snapshot(NOW + t + 1.0).ranks[0].step is None


def test_the_launchers_are_grouped_again_after_a_hello_and_only_then():
    """The ranks' grouping by the process that started them is kept between snapshots (made per
    rank, every poll, it was work for nothing): a hello, a rank read again or a new rank
    changes it."""
    s = Stream(world=3)
    for rank in (0, 1):
        s.ev(rank, 0.0, "hello", local_rank=rank, world_size=3, host="node0", pid=10 + rank, ppid=9)
    state = state_of(s)
    first = state.snapshot(NOW + 1, live=False)
    assert [(v.pid, v.ranks) for v in first.launchers] == [(9, (0, 1))]
    assert state.snapshot(NOW + 1.5, live=False).launchers == first.launchers
    state.apply(
        {"v": 1, "t": NOW + 2, "rank": 2, "kind": "hello", "host": "node1", "pid": 12, "ppid": 8},
        None,
    )
    assert [(v.pid, v.ranks) for v in state.snapshot(NOW + 2.5, live=False).launchers] == [
        (9, (0, 1)),
        (8, (2,)),
    ]
    state.restart_rank(1)  # read again from its start: no hello yet, in no launcher's group
    assert [(v.pid, v.ranks) for v in state.snapshot(NOW + 3, live=False).launchers] == [
        (9, (0,)),
        (8, (2,)),
    ]


def test_a_rank_that_goes_on_alone_shows_its_latest_call_numbers():
    """Rank 0 ended (its view no longer remade); rank 1 starts one more call: its view has the
    new number (a view once read the rank's numbers as they stood when rank 0's was made)."""
    s = Stream()
    s.hello()
    t = s.steps(2)
    state = state_of(s)
    s.events = {0: [], 1: []}
    s.ev(0, t + 0.1, "exit", code=0, reason="normal")
    state.apply(s.events[0][0], ("events/rank-0.jsonl", 99))
    assert state.snapshot(NOW + t + 0.2, live=True).ranks[1].seq_in() == 2
    s.collective(1, t + 0.3, dur=None)
    state.apply(s.events[1][0], ("events/rank-1.jsonl", 99))
    snap = state.snapshot(NOW + t + 0.4, live=True)
    assert snap.ranks[1].seq_in() == 3 and snap.ranks[1].collective.seq == 3


def test_a_steps_forwards_are_kept():
    s = Stream()
    s.hello()
    s.ev(0, 1.0, "step", step=1, forwards=4, step_time_s=0.1)
    s.ev(0, 1.2, "step", step=2, forwards=0, step_time_s=0.1)  # (no DDP forward: unknown)
    snap = state_of(s).snapshot(NOW + 1.3, live=True)
    assert snap.ranks[0].step_forwards == 4 and snap.ranks[1].step_forwards is None
