from __future__ import annotations

from dataclasses import replace

from ddpdoctor.monitor.judge.rules import hang
from ddpdoctor.monitor.model.snapshot import Activity, RankState, StackGroup, Verdict
from ddpdoctor.protocol.verdicts import ActivityState
from tests.unit.monitor.test_monitor_builders import NOW, coll, snap, thresholds, view, waiting

CULPRIT_STACK = StackGroup(
    ranks=(1,),
    frames=("reference_job.py:300 main", "… 3 library frames", "reference_job.py:120 _inject_hang"),
)


def culprit(state=RankState.RUNNING, **kw):
    kw.setdefault("last_event", "fault hang")
    kw.setdefault("last_progress_t", NOW - 9.0)
    return view(1, state, seq=40, **kw)


def test_rank_that_never_reached_the_collective_is_the_culprit():
    out = hang.detect(snap([waiting(0, 41, 8.0), culprit()], stacks=(CULPRIT_STACK,)))
    assert out is not None and out.verdict is Verdict.HANG
    assert out.culprits == {1}
    text = out.findings[0].summary
    assert text.startswith("rank 1 never reached all_reduce #41 of [10] float32")
    assert "in phase train at step 10" in text and "last event fault hang" in text
    assert "stack: reference_job.py:120 _inject_hang" in text
    assert out.findings[0].ranks == (1,)
    assert out.stalled == {1} and dict(out.waiting_on) == {0: (1,)}


def test_timing_runs_from_the_culprits_last_progress_to_threshold_past_the_wait():
    out = hang.detect(snap([waiting(0, 41, 8.0), culprit()]))
    assert out.started_t == NOW - 9.0
    assert out.onset_t == NOW - 8.0 + 5.0


def test_wait_below_the_threshold_is_legitimate_waiting_not_a_hang():
    assert hang.detect(snap([waiting(0, 41, 3.0), culprit()])) is None


def test_healthy_ranks_are_not_flagged():
    assert hang.detect(snap([view(0), view(1)])) is None


def test_a_merely_slow_job_with_a_higher_threshold_is_not_flagged():
    ranks = [waiting(0, 41, 8.0), culprit()]
    assert hang.detect(snap(ranks, hang_after=12.0)) is None


def test_waiting_rank_without_heartbeat_is_not_a_hang():
    dead = waiting(0, 41, 8.0, heartbeat_age_s=6.0, alive=None)
    assert hang.detect(snap([dead, culprit()])) is None


def test_everyone_in_the_collective_is_not_this_rule():
    assert hang.detect(snap([waiting(0, 41, 8.0), waiting(1, 41, 8.0)])) is None


def test_culprit_that_exited_normally_is_named_with_its_step():
    done = view(1, RankState.DONE, seq=40, step=12, last_event="exit 0", exit_code=0)
    out = hang.detect(snap([waiting(0, 41, 8.0), done]))
    assert out.culprits == {1}
    assert "it exited normally (code 0) at step 12" in out.findings[0].summary


def test_several_culprits_in_a_bigger_world():
    ranks = [waiting(0, 41, 8.0), waiting(1, 41, 7.0), culprit(), view(3, seq=39)]
    ranks[2] = replace(ranks[2], rank=2)
    out = hang.detect(snap(ranks))
    assert out.culprits == {2, 3}
    assert out.findings[0].summary.startswith("ranks 2, 3 never reached all_reduce #41")


def test_point_to_point_waits_do_not_count():
    recv = view(0, RankState.WAITING, collective=coll("recv", 5, 9.0, group="default/p2p/1"))
    assert hang.detect(snap([recv, culprit()])) is None


def test_subgroup_members_only():
    sub = coll("all_reduce", 3, 9.0, group="pg1", group_ranks=(0, 2))
    ranks = [
        view(0, RankState.WAITING, collective=sub, group_seqs=(("default", 40), ("pg1", 3))),
        view(1, seq=30),  # far behind in the world group, but not a member of pg1
        view(2, group_seqs=(("default", 40), ("pg1", 2)), last_event="phase eval"),
    ]
    out = hang.detect(snap(ranks))
    assert out.culprits == {2}
    assert "all_reduce #3 of [10] float32 (group pg1)" in out.findings[0].summary


def test_post_mortem_a_waiter_that_failed_after_the_threshold_still_shows_the_hang():
    failed_coll = coll("all_reduce", 41, 8.0, since_t=NOW - 10.0)
    waiter = view(
        0,
        RankState.FAILED,
        collective=failed_coll,
        seq=40,
        heartbeat_age_s=2.0,
        error="RuntimeError: Connection closed by peer",
        failed_t=NOW - 2.0,
    )
    out = hang.detect(snap([waiter, culprit()]))
    assert out is not None and out.culprits == {1}
    assert out.onset_t == NOW - 10.0 + 5.0


def test_post_mortem_waiter_whose_heartbeat_stopped_early_is_not_a_hang():
    failed_coll = coll("all_reduce", 41, 8.0, since_t=NOW - 10.0)
    waiter = view(
        0,
        RankState.GONE,
        collective=failed_coll,
        seq=40,
        last_heartbeat_t=NOW - 9.5,
        heartbeat_age_s=9.5,
    )
    assert hang.detect(snap([waiter, culprit()])) is None


def test_culprit_stopped_after_the_hang_is_described_where_it_was():
    stopped = culprit(state=RankState.FAILED, exit_code=-15, exit_signal="SIGTERM", failed_t=NOW)
    waiter = waiting(0, 41, 8.0)
    out = hang.detect(snap([waiter, stopped]))
    text = out.findings[0].summary
    assert "it is in phase train at step 10, last event fault hang" in text
    assert "then it was stopped by SIGTERM" in text


def _blocked_for(seconds, **kw):
    activity = Activity(ActivityState.BLOCKED, 0.0, "train.py:40 wait_for_file", seconds)
    return culprit(activity=activity, **kw)


def _soon(ranks, **kw):
    th = replace(thresholds(5.0), hang_blocked_after_s=2.5, heartbeat_period_s=1.0)
    return replace(snap(ranks, **kw), thresholds=th)


def test_a_culprit_blocked_for_the_whole_wait_is_a_hang_at_the_sooner_threshold():
    out = hang.detect(_soon([waiting(0, 41, 2.7), _blocked_for(2.0)]))
    assert out is not None and out.culprits == {1}
    assert out.onset_t == NOW - 2.7 + 2.5
    assert "every rank behind blocked" in " ".join(e.text for e in out.findings[0].evidence)


def test_the_sooner_threshold_needs_the_evidence_to_cover_the_wait():
    # blocked for a second of a 3 s wait: it was doing something a moment ago
    assert hang.detect(_soon([waiting(0, 41, 3.0), _blocked_for(1.0)])) is None
    # under the sooner threshold itself
    assert hang.detect(_soon([waiting(0, 41, 2.0), _blocked_for(2.0)])) is None


def test_a_busy_or_undecided_culprit_still_takes_the_full_threshold():
    busy = Activity(ActivityState.BUSY, 95.0, "train.py:60 evaluate", 3.0)
    assert hang.detect(_soon([waiting(0, 41, 3.0), culprit(activity=busy)])) is None
    assert hang.detect(_soon([waiting(0, 41, 3.0), culprit()])) is None  # activity unknown
    assert hang.detect(_soon([waiting(0, 41, 5.5), culprit()])) is not None


def test_every_rank_behind_must_be_blocked_for_the_sooner_threshold():
    other = view(2, seq=40, last_progress_t=NOW - 9.0)  # activity unknown
    ranks = [waiting(0, 41, 3.0), _blocked_for(3.0), other]
    assert hang.detect(_soon(ranks)) is None
