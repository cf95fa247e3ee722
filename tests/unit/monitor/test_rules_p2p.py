"""The point-to-point wait-for graph (rules/p2p.py): a stalled stage is a hang named with its
line, a cycle of waits is a deadlock naming both calls, a busy peer is a wait."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.monitor.judge import diagnose
from ddpdoctor.monitor.judge.rules import p2p
from ddpdoctor.monitor.model.pipeline_view import PipelineView
from ddpdoctor.monitor.model.snapshot import (
    Activity,
    ActivityState,
    CallSite,
    RankState,
    Verdict,
)
from tests.unit.monitor.test_monitor_builders import NOW, coll, snap, thresholds, view

SITE0 = CallSite("job.py:72 main", file="/w/job.py", line=72)
SITE1 = CallSite("job.py:40 last_stage", file="/w/job.py", line=40)


def blocked(where: str, since: float = 9.0) -> Activity:
    return Activity(ActivityState.BLOCKED, 0.0, where, since)


def busy(where: str) -> Activity:
    return Activity(ActivityState.BUSY, 100.0, where, 9.0)


def p2p_wait(rank, op, peer, waited, site=SITE0, seq=41, **kw):
    call = coll(op, seq, waited, group=f"default/p2p/{peer}", peers=(peer,), site=site)
    kw.setdefault("activity", blocked(site.user))
    return view(rank, RankState.WAITING, collective=call, **kw)


def stalled_stage(rank=1, **kw):
    kw.setdefault("activity", blocked("job.py:34 forward"))
    kw.setdefault("pipeline", PipelineView("ScheduleGPipe", 4, 2, (1,), 6, "F", 0, 1))
    return view(rank, RankState.STALLED, **kw)


def test_a_rank_waiting_in_irecv_on_a_stalled_stage_is_a_hang_of_that_stage_at_its_line():
    out = p2p.detect(snap([p2p_wait(0, "irecv", 1, 8.0), stalled_stage()]))
    assert out is not None and out.verdict is Verdict.HANG and out.confirmed
    assert out.culprits == {1}
    finding = out.findings[0]
    assert finding.summary.startswith("rank 1 (pipeline stage 1/2) stopped answering")
    assert "step 6 F0 (stage 1)" in finding.summary
    assert "rank 0 waits in irecv #41 from rank 1 at job.py:72 main" in finding.summary
    stuck = finding.evidence[0]
    assert (stuck.file, stuck.line) == ("job.py", 34)
    assert dict(out.waiting_on) == {0: (1,)}
    assert out.onset_t == 1_000_000.0 - 8.0 + 5.0


def test_the_chain_is_followed_to_the_rank_that_waits_for_nobody():
    ranks = [
        p2p_wait(0, "irecv", 1, 8.0),
        p2p_wait(1, "irecv", 2, 7.0),
        stalled_stage(2),
    ]
    out = p2p.detect(snap(ranks))
    assert out.culprits == {2}
    assert dict(out.waiting_on) == {0: (2,), 1: (2,)}


def test_a_busy_peer_is_a_wait_not_a_hang():
    ranks = [p2p_wait(0, "irecv", 1, 8.0), view(1, activity=busy("job.py:50 evaluate"))]
    assert p2p.detect(snap(ranks)) is None


def test_a_short_wait_is_no_hang():
    assert p2p.detect(snap([p2p_wait(0, "irecv", 1, 3.0), stalled_stage()])) is None


def test_two_ranks_receiving_from_each_other_is_a_deadlock_naming_both_calls():
    ranks = [p2p_wait(0, "recv", 1, 8.0), p2p_wait(1, "recv", 0, 8.0, site=SITE1)]
    out = p2p.detect(snap(ranks))
    assert out is not None and out.verdict is Verdict.MISMATCH and out.confirmed
    finding = out.findings[0]
    assert finding.id == "p2p.deadlock" and finding.ranks == (0, 1)
    assert "rank 0 waits in recv #41 from rank 1 at job.py:72 main" in finding.summary
    assert "rank 1 waits in recv #41 from rank 0 at job.py:40 last_stage" in finding.summary
    assert {(e.file, e.line) for e in finding.evidence} == {("/w/job.py", 72), ("/w/job.py", 40)}


def test_a_send_whose_receiver_went_on_to_a_collective_is_a_deadlock():
    barrier = coll("all_reduce", 12, 8.0, site=SITE1)
    ranks = [
        p2p_wait(0, "send", 1, 8.0, seq=6, group_seqs=(("default", 11),)),
        view(1, RankState.WAITING, collective=barrier, seq=11, activity=blocked(SITE1.user)),
    ]
    out = diagnose.diagnose(snap(ranks))
    assert out.verdict is Verdict.MISMATCH
    finding = out.findings[0]
    assert finding.id == "p2p.deadlock" and finding.ranks == (0, 1)
    assert "rank 0 waits in send #6 to rank 1" in finding.summary
    assert "rank 1 waits in all_reduce #12" in finding.summary


def test_a_receive_from_a_rank_that_ended_cleanly_names_the_waiting_call():
    done = view(1, RankState.DONE, exit_code=0)
    out = p2p.detect(snap([p2p_wait(0, "irecv", 1, 8.0), done]))
    assert out.verdict is Verdict.MISMATCH
    assert "rank 1 ended cleanly without the matching call" in out.findings[0].summary


def test_an_old_isend_of_a_stage_stalled_elsewhere_is_not_its_wait():
    # rank 1 posted an isend from main, then stalled in its forward: rank 1 is the culprit
    old_send = p2p_wait(1, "isend", 0, 9.0, activity=blocked("job.py:34 forward"))
    out = p2p.detect(snap([p2p_wait(0, "irecv", 1, 8.0), old_send]))
    assert out is not None and out.verdict is Verdict.HANG and out.culprits == {1}


def test_the_diagnosis_is_the_p2p_hang_not_a_silent_wait():
    out = diagnose.diagnose(snap([p2p_wait(0, "isend", 1, 8.0), stalled_stage()]))
    assert out.verdict is Verdict.HANG and out.culprits == {1} and out.confirmed


def test_healthy_pipeline_ranks_are_not_flagged():
    ranks = [p2p_wait(0, "irecv", 1, 0.2), p2p_wait(1, "isend", 0, 0.1, site=SITE1)]
    assert p2p.detect(snap(ranks)) is None


# -- the sooner threshold: a culprit blocked for the whole wait ----------------------------------


def _soon(ranks, **kw):
    """hang_after 5 s, hang_blocked_after 2.5 s, one heartbeat a second."""
    th = replace(thresholds(5.0), hang_blocked_after_s=2.5, heartbeat_period_s=1.0)
    return replace(snap(ranks, **kw), thresholds=th)


def _evidence(out) -> str:
    return " | ".join(e.text for e in out.findings[0].evidence)


def test_a_stage_blocked_for_the_whole_wait_is_a_hang_at_the_sooner_threshold():
    stage = stalled_stage(activity=blocked("job.py:34 forward", since=2.0))
    out = p2p.detect(_soon([p2p_wait(0, "irecv", 1, 2.7), stage]))
    assert out is not None and out.verdict is Verdict.HANG and out.confirmed
    assert out.culprits == {1}
    assert out.onset_t == NOW - 2.7 + 2.5
    assert "(threshold 2.5 s, rank 1 blocked; heartbeat alive)" in _evidence(out)
    # at the end of a chain too, on the first rank's wait; and it is the diagnosis
    ranks = [p2p_wait(0, "irecv", 1, 2.9), p2p_wait(1, "irecv", 2, 2.8), stalled_stage(2)]
    out = diagnose.diagnose(_soon(ranks))
    assert out.verdict is Verdict.HANG and out.culprits == {2} and out.confirmed
    assert out.onset_t == NOW - 2.9 + 2.5


def test_a_stage_not_blocked_for_the_whole_wait_takes_the_full_threshold():
    blocked_all_along = stalled_stage(activity=blocked("job.py:34 forward", since=3.0))
    assert p2p.detect(_soon([p2p_wait(0, "irecv", 1, 3.0), blocked_all_along])) is not None
    # the same wait: blocked for only the last second of it (it was working before), or of
    # unknown activity (no progress facts), or silent
    for stage in (
        stalled_stage(activity=blocked("job.py:34 forward", since=1.0)),
        stalled_stage(activity=None),
        stalled_stage(activity=None, heartbeat_age_s=4.0),
    ):
        assert p2p.detect(_soon([p2p_wait(0, "irecv", 1, 3.0), stage])) is None
        out = p2p.detect(_soon([p2p_wait(0, "irecv", 1, 5.5), stage]))
        assert out is not None and out.verdict is Verdict.HANG and out.culprits == {1}
        assert out.onset_t == NOW - 5.5 + 5.0
        assert "(threshold 5.0 s; heartbeat alive)" in _evidence(out)


def test_a_deadlock_or_a_counterpart_never_posted_waits_the_full_threshold():
    # every rank of the cycle is blocked for the whole wait: still no evidence before 5 s
    cycle = [p2p_wait(0, "recv", 1, 3.0), p2p_wait(1, "recv", 0, 3.0, site=SITE1)]
    assert p2p.detect(_soon(cycle)) is None
    assert diagnose.diagnose(_soon(cycle)).verdict not in (Verdict.MISMATCH, Verdict.HANG)
    done = view(1, RankState.DONE, exit_code=0)
    assert p2p.detect(_soon([p2p_wait(0, "irecv", 1, 3.0), done])) is None
    late = [p2p_wait(0, "recv", 1, 5.5), p2p_wait(1, "recv", 0, 5.5, site=SITE1)]
    out = p2p.detect(_soon(late))
    assert out is not None and out.findings[0].id == "p2p.deadlock"
    assert out.onset_t == NOW - 5.5 + 5.0
