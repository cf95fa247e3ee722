from __future__ import annotations

import json

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor import diagnose_run_dir
from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, Stream, coll, snap, view, waiting


def test_mismatch_explains_the_crash_it_caused():
    r0 = view(
        0,
        RankState.GONE,
        collective=coll("all_reduce", 41, 0.1, shapes=((10,),)),
        seq=40,
        failed_t=NOW - 1.0,
        exit_signal="SIGABRT",
        exit_code=-6,
    )
    r1 = view(
        1,
        RankState.FAILED,
        collective=coll("all_reduce", 41, 0.1, shapes=((11,),)),
        seq=40,
        failed_t=NOW - 0.9,
        error="RuntimeError: Connection reset by peer",
    )
    d = diagnose(snap([r0, r1]))
    assert d.verdict is Verdict.MISMATCH
    ids = [f.id for f in d.findings]
    assert ids[0] == "mismatch" and "died" in ids and "crash.consequence" in ids


def test_hang_then_stop_stays_a_hang():
    waiter = view(
        0,
        RankState.FAILED,
        collective=coll("all_reduce", 41, 8.0, since_t=NOW - 9.0),
        seq=40,
        failed_t=NOW - 0.5,
        exit_signal="SIGTERM",
        exit_reason="signal",
        exit_code=-15,
        heartbeat_age_s=0.6,
    )
    culprit = view(
        1,
        RankState.GONE,
        seq=40,
        failed_t=NOW - 0.5,
        last_progress_t=NOW - 10.0,
        last_event="fault hang",
        heartbeat_age_s=0.6,
    )
    d = diagnose(snap([waiter, culprit]))
    assert d.verdict is Verdict.HANG and d.culprits == {1}
    assert [f.id for f in d.findings][:2] == ["hang", "crash.consequence"]
    assert "the hang" in d.findings[1].summary


def test_crash_before_the_wait_passes_the_threshold_is_a_crash():
    waiter = waiting(0, 41, 3.0)
    crashed = view(1, RankState.FAILED, seq=40, error="ValueError: x", failed_t=NOW - 2.0)
    d = diagnose(snap([waiter, crashed]))
    assert d.verdict is Verdict.CRASH and d.culprits == {1}


def test_uneven_inputs_and_other_findings_come_after_the_primary_one():
    extra = Finding("nccl.warn", Severity.WARNING, "an NCCL warning", "fix it")
    ranks = [
        waiting(0, 41, 8.0, step=12, epoch_batches=12, loader_batches=((1, 12),)),
        view(1, seq=40, step=10, epoch_batches=10, loader_batches=((1, 10),)),
    ]
    d = diagnose(snap(ranks), extra_findings=[extra, extra])
    ids = [f.id for f in d.findings]
    assert ids[0] == "hang" and "uneven_inputs" in ids and "sampler.uneven_batches" in ids
    assert ids.count("nccl.warn") == 1


def test_healthy_snapshot_keeps_its_verdict():
    d = diagnose(snap([view(0), view(1)], verdict=Verdict.RUNNING))
    assert d.verdict is Verdict.RUNNING and not d.findings and d.detected_after_s is None


def test_apply_marks_culprits_stalled_and_waiters_waiting_on_them():
    s = snap([waiting(0, 41, 8.0), view(1, seq=40, last_progress_t=NOW - 9.0)])
    out = apply_diagnosis(s, diagnose(s))
    assert out.verdict is Verdict.HANG and out.culprits == {1}
    assert out.ranks[1].state is RankState.STALLED
    assert out.ranks[0].state is RankState.WAITING and out.ranks[0].waiting_on == (1,)
    assert out.detected_after_s == pytest.approx(6.0)  # progress 9 s ago; waiting since 8 s + 5 s
    assert out.diagnosis_json()["culprits"] == [1]


def hung_stream() -> Stream:
    s = Stream()
    s.hello(host="some-other-machine")
    t = s.steps(5)
    s.ev(1, t, "fault", inject="hang:rank=1,step=6", fault="hang", step=6)
    s.collective(0, t + 0.01, dur=None)
    s.heartbeats(
        0,
        t,
        t + 12,
        open={"op": "all_reduce", "seq": 6, "group": "default", "since_t": NOW + t + 0.01},
    )
    s.heartbeats(1, t, t + 12, step=5, phase="train", open=None)
    return s


def test_post_mortem_of_a_copied_run_directory(tmp_path):
    run = hung_stream().write(tmp_path / "copied")
    out = diagnose_run_dir(run)
    assert not out.live and out.finished  # nothing alive; time stops at the last event
    assert out.verdict is Verdict.HANG and out.culprits == {1}
    assert out.ranks[0].alive is None  # another machine: not "gone" for want of a pid
    assert out.findings[0].summary.startswith("rank 1 never reached all_reduce #6")
    assert out.detected_after_s == pytest.approx(5.01, abs=0.05)
    assert not (run / "diagnosis.json").exists()  # a post-mortem writes nothing


def test_post_mortem_prefers_the_live_monitors_timing(tmp_path):
    run = hung_stream().write(tmp_path / "copied")
    (run / "diagnosis.json").write_text(json.dumps({"verdict": "hang", "detected_after_s": 6.4}))
    assert diagnose_run_dir(run).detected_after_s == 6.4


def test_not_a_run_directory(tmp_path):
    with pytest.raises(UsageError, match="not a run directory"):
        diagnose_run_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"no run\.json and no events"):
        diagnose_run_dir(tmp_path / "empty")


def _stopped_short_of_the_threshold() -> Stream:
    """The launcher stopped the hang at the sooner threshold (2.6 s: the rank behind blocked,
    judged live): the stop ended both ranks 3 s into the wait, short of the 5 s floor."""
    s = Stream()
    s.hello(host="some-other-machine")
    t = s.steps(5)
    s.ev(1, t, "fault", inject="hang:rank=1,step=6", fault="hang", step=6)
    s.collective(0, t + 0.01, dur=None)
    since = NOW + t + 0.01
    s.heartbeats(
        0, t, t + 3, open={"op": "all_reduce", "seq": 6, "group": "default", "since_t": since}
    )
    s.heartbeats(1, t, t + 3, step=5, phase="train", open=None)
    for rank in (0, 1):
        s.ev(rank, t + 3.05, "exit", code=-15, reason="signal", signal="SIGTERM")
    return s


def test_the_stop_on_file_holds_where_the_evidence_alone_falls_short(tmp_path):
    """A run directory mailed in without diagnosis.json: the launcher's stop record
    (stopped.json, written as it stopped the job) says what it stopped for; without it the
    ranks ended by the stop read as stopped from outside."""
    from ddpdoctor.monitor.judge.held import stop_file
    from ddpdoctor.monitor.judge.rules import RuleOutcome

    run = _stopped_short_of_the_threshold().write(tmp_path / "mailed-in")
    assert diagnose_run_dir(run).verdict is not Verdict.HANG
    finding = Finding("hang", Severity.ERROR, "rank 1 never reached all_reduce #6 (...)", "fix")
    held = RuleOutcome(
        rule="hang", verdict=Verdict.HANG, culprits=frozenset({1}), findings=(finding,)
    )
    (run / "stopped.json").write_text(json.dumps(stop_file(held)))
    out = diagnose_run_dir(run)
    assert out.verdict is Verdict.HANG and out.culprits == {1}
    assert out.findings[0].summary == finding.summary
    (run / "stopped.json").write_text(json.dumps({"schema_version": 2, "stopped_for": "hang"}))
    assert diagnose_run_dir(run).verdict is not Verdict.HANG  # a record it cannot read: none
