"""Waits for busy ranks are not hangs; blocked culprits still are (hand-built snapshots)."""

from __future__ import annotations

import json
from dataclasses import replace

from ddpdoctor.findings import Severity
from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.judge.rules import hang, transport, wait
from ddpdoctor.monitor.model.snapshot import Activity, RankState, RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.model.thresholds import compute_thresholds
from ddpdoctor.protocol.verdicts import ActivityState
from tests.unit.monitor.test_monitor_builders import NOW, Stream, snap, view, waiting

BUSY = Activity(ActivityState.BUSY, 99.0, "train.py:88 evaluate", 20.0, frame="nn.py:1 forward")
BLOCKED = Activity(ActivityState.BLOCKED, 0.2, "prep.py:12 main", 20.0, frame="time.py:0 sleep")
GPU = Activity(ActivityState.GPU_WAIT, 2.0, "train.py:90 evaluate", 20.0, gpu_util_pct=95.0)


def rank0(activity, state=RankState.RUNNING, **kw):
    kw.setdefault("last_progress_t", NOW - 21.0)
    return view(0, state, seq=40, activity=activity, **kw)


def diagnosed(ranks, **kw):
    s = snap(ranks, **kw)
    return apply_diagnosis(s, diagnose(s))


def pg_thresholds(hang_after=5.0, timeout=1800.0, given=False):
    return compute_thresholds(
        hang_after=hang_after,
        step_times=[],
        training_waits=[],
        all_waits=[],
        heartbeat_period=1.0,
        training_started=True,
        pg_timeout_s=timeout,
        pg_timeout_given=given,
        backend="gloo",
    )


def test_ranks_waiting_for_a_busy_rank_are_a_wait_not_a_hang():
    ranks = [rank0(BUSY), waiting(1, 41, 20.0), waiting(2, 41, 19.0)]
    assert hang.detect(snap(ranks)) is None
    d = diagnosed(ranks)
    assert d.verdict is Verdict.RUNNING and not d.confirmed and not d.culprits
    (found,) = [f for f in d.findings if f.id == "wait.busy_rank"]
    assert found.severity is Severity.INFO and found.ranks == (0,)
    assert found.summary.startswith(
        "ranks 1, 2 wait 20 s for rank 0, busy in train.py:88 evaluate (CPU 99%) in all_reduce #41"
    )
    (w,) = d.waits
    assert w.busy and w.waiters == (1, 2) and w.on == (0,) and w.severity == "info"


def test_a_blocked_culprit_is_a_confirmed_hang_named_with_where_it_blocks():
    ranks = [rank0(BLOCKED), waiting(1, 41, 8.0)]
    out = hang.detect(snap(ranks))
    assert out is not None and out.verdict is Verdict.HANG and out.culprits == {0}
    assert out.confirmed
    assert "blocked in prep.py:12 main (CPU 0%)" in out.findings[0].summary
    d = diagnosed(ranks)
    assert d.verdict is Verdict.HANG and d.confirmed
    assert not [f for f in d.findings if f.id == "wait.busy_rank"]
    (w,) = d.waits
    assert not w.busy and w.severity is None and w.activity == BLOCKED


def test_a_rank_waiting_on_its_gpu_is_making_progress():
    ranks = [rank0(GPU), waiting(1, 41, 30.0)]
    d = diagnosed(ranks)
    assert d.verdict is Verdict.RUNNING
    assert "waiting on its GPU in train.py:90 evaluate (CPU 2%, GPU 95%)" in d.waits[0].summary


def test_of_two_ranks_behind_only_the_blocked_one_is_the_culprit():
    ranks = [rank0(BUSY), waiting(1, 41, 8.0), replace(rank0(BLOCKED), rank=2)]
    out = hang.detect(snap(ranks))
    assert out.culprits == {2}


def test_unknown_activity_and_silent_heartbeats_stay_what_they_were():
    """No progress facts (an older runtime) or a heartbeat that stopped: a hang as before."""
    assert hang.detect(snap([rank0(None), waiting(1, 41, 8.0)])).culprits == {0}
    silent = rank0(None, state=RankState.STALLED, heartbeat_age_s=9.0)
    assert hang.detect(snap([silent, waiting(1, 41, 8.0)])).confirmed


def test_the_wait_becomes_a_warning_then_an_error_near_the_process_group_timeout():
    th = pg_thresholds(timeout=600.0, given=True)
    assert th.wait_warn_after_s == 60.0 and th.wait_error_after_s == 480.0
    assert th.pg_timeout_basis == "init_process_group(timeout=...)"
    for waited, severity in (
        (30.0, Severity.INFO),
        (90.0, Severity.WARNING),
        (500.0, Severity.ERROR),
    ):
        s = replace(snap([rank0(BUSY), waiting(1, 41, waited)]), thresholds=th)
        d = apply_diagnosis(s, diagnose(s))
        assert d.verdict is Verdict.RUNNING
        (found,) = [f for f in d.findings if f.id == "wait.busy_rank"]
        assert found.severity is severity
    assert "the process group times out in 100 s" in found.summary
    assert "timeout=datetime.timedelta" in found.fix
    assert d.waits[0].timeout_in_s == 100.0


def test_thresholds_follow_torchs_defaults_per_backend():
    gloo = compute_thresholds(
        hang_after=None,
        step_times=[],
        training_waits=[],
        all_waits=[],
        heartbeat_period=1.0,
        training_started=False,
        backend="gloo",
    )
    nccl = replace(gloo, **{})
    assert gloo.pg_timeout_s == 1800.0 and gloo.pg_timeout_basis == "torch's default for gloo"
    assert gloo.wait_warn_after_s == 60.0 and gloo.wait_error_after_s == 1440.0
    nccl = compute_thresholds(
        hang_after=None,
        step_times=[],
        training_waits=[],
        all_waits=[],
        heartbeat_period=1.0,
        training_started=False,
        backend="nccl",
    )
    assert nccl.pg_timeout_s == 600.0
    short = pg_thresholds(hang_after=5.0, timeout=30.0, given=True)
    assert short.wait_warn_after_s == 15.0 and short.wait_error_after_s == 24.0


def test_transport_stall_is_reported_but_not_confirmed():
    ranks = [waiting(0, 41, 8.0), waiting(1, 41, 8.0)]
    out = transport.detect(snap(ranks))
    assert out is not None and out.verdict is Verdict.HANG and not out.confirmed


def test_diagnosis_json_carries_activity_waits_and_the_countdown():
    s = replace(snap([rank0(BUSY), waiting(1, 41, 20.0)]), thresholds=pg_thresholds())
    d = apply_diagnosis(s, diagnose(s))
    data = json.loads(json.dumps(d.diagnosis_json()))
    assert data["verdict"] == "running" and data["confirmed"] is False
    assert data["ranks"][0]["activity"] == {
        "state": "busy",
        "cpu_pct": 99.0,
        "where": "train.py:88 evaluate",
        "since_s": 20.0,
        "frame": "nn.py:1 forward",
        "child_cpu_pct": None,
        "gpu_util_pct": None,
    }
    (w,) = data["waits"]
    assert w["waiters"] == [1] and w["on"] == [0] and w["busy"] is True
    assert w["collective"]["op"] == "all_reduce" and w["collective"]["seq"] == 41
    assert w["severity"] == "info" and w["summary"].startswith("rank 1 waits 20 s for rank 0")
    assert w["timeout_s"] == 1800.0 and w["timeout_in_s"] == 1780.0
    assert data["thresholds"]["pg_timeout_s"] == 1800.0


def test_no_waits_no_rule_outcome():
    assert wait.detect(snap([view(0), view(1)])) is None


def _stream_wait(cpu_per_s: float) -> RunState:
    """Rank 0 works (or sleeps) outside any collective for 20 s; rank 1 waits in barrier #1."""
    s = Stream(world=2)
    s.hello()
    s.ev(0, 0.5, "phase", phase="data")
    s.ev(1, 0.5, "collective_start", op="barrier", seq=1, group="default")
    for i in range(21):
        t = 1.0 + i
        s.ev(
            0,
            t,
            "heartbeat",
            step=0,
            phase="data",
            open=None,
            cpu_s=1.0 + cpu_per_s * i,
            io_bytes=1000,
            frame="prep.py:8 unpack",
            where="prep.py:8 unpack",
        )
        s.ev(
            1,
            t,
            "heartbeat",
            step=0,
            phase="init",
            cpu_s=1.0,
            io_bytes=1000,
            frame="c10d.py:1 barrier",
            where="prep.py:20 <module>",
            open={"op": "barrier", "seq": 1, "group": "default", "since_t": NOW + 0.5},
        )
    state = RunState(RunInfo(name="t", run_dir="/tmp/t", world_size=2, backend="gloo"))
    for rank in (0, 1):
        for event in s.events[rank]:
            state.apply(event)
    return state


def test_events_of_a_busy_rank_zero_make_a_running_wait():
    state = _stream_wait(cpu_per_s=0.98)
    s = state.snapshot(NOW + 21.2)
    d = apply_diagnosis(s, diagnose(s))
    r0 = d.ranks[0]
    assert r0.state is RankState.RUNNING and r0.activity.state is ActivityState.BUSY
    assert d.verdict is Verdict.RUNNING and d.waits[0].busy
    assert d.waits[0].summary.startswith("rank 1 waits 21 s for rank 0, busy in prep.py:8 unpack")


def test_events_of_a_sleeping_rank_zero_make_a_hang():
    state = _stream_wait(cpu_per_s=0.0)
    s = state.snapshot(NOW + 21.2)
    d = apply_diagnosis(s, diagnose(s))
    assert d.verdict is Verdict.HANG and d.culprits == {0} and d.confirmed
    assert d.ranks[0].state is RankState.STALLED


def test_a_rank_behind_not_judged_yet_is_no_culprit_until_its_heartbeats_tell():
    """It reports progress facts but has too few heartbeats so far (just started, a slow
    machine): a few seconds more, rather than a hang called on a rank that may be busy."""
    fresh = rank0(None, reports_progress=True)
    assert hang.detect(snap([fresh, waiting(1, 41, 8.0)])) is None
    old_runtime = rank0(None, reports_progress=False)
    assert hang.detect(snap([old_runtime, waiting(1, 41, 8.0)])).culprits == {0}


def test_a_wait_is_shown_from_the_start_not_only_past_the_hang_threshold():
    """Before training the hang threshold is 15 s; the wait for a busy rank 0 shows at once."""
    ranks = [rank0(BUSY), waiting(1, 41, 2.0)]
    d = diagnosed(ranks, hang_after=15.0)
    assert d.waits and d.waits[0].busy and d.waits[0].waiting_s == 2.0
    silent = waiting(1, 41, 2.0, heartbeat_age_s=9.0)
    assert wait.detect(snap([rank0(BUSY), silent], hang_after=15.0)) is None
