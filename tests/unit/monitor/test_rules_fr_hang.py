"""hang from the flight recorder, and the recorder's evidence on hang and mismatch findings, on
real gloo dumps (tests/fixtures/flight_recorder)."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge import fr_evidence
from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import fr_hang, fr_mismatch, wait
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import snap, view
from tests.unit.protocol.test_flight_recorder import load

WAITER, CULPRIT = load("hang-gloo", 0), load("hang-gloo", 1)
# the waiter scheduled #8 at CREATED; the culprit's dump came 3.66 s later, the waiter's 5.48 s
CREATED = WAITER.pending("0").created_t


def hung(hang_after=3.0, dumps=(WAITER, CULPRIT)):
    ranks = [
        view(0, last_progress_t=CREATED),
        view(1, last_event="step 2", last_progress_t=CREATED - 0.5),
    ]
    return replace(snap(ranks, hang_after=hang_after, now=WAITER.taken_t), flight_recorder=dumps)


def test_the_rank_whose_backend_never_scheduled_the_collective_is_the_culprit():
    out = fr_hang.detect(hung())
    assert out is not None and out.verdict is Verdict.HANG and out.culprits == {1}
    finding = out.findings[0]
    assert finding.id == "hang" and finding.ranks == (1,)
    assert finding.summary.startswith(
        "rank 1 never reached all_reduce #8 (rank 0 waits in it, 5.5 s; flight recorder)"
    )
    assert "last event step 2" in finding.summary
    texts = [e.text for e in finding.evidence]
    assert texts[0] == (
        "flight recorder, rank 1: its backend never started all_reduce #8 "
        "(last scheduled #7, last completed #7)"
    )
    assert (
        "flight recorder, rank 0: gloo all_reduce #8 (float32[2372]) scheduled 5.5 s" in texts[-1]
    )
    assert out.onset_t == CREATED + 3.0 and out.started_t == CREATED - 0.5
    assert dict(out.waiting_on) == {0: (1,)} and out.stalled == {1}


def test_a_culprit_dump_taken_before_the_threshold_passed_is_not_enough():
    assert fr_hang.detect(hung(hang_after=5.0)) is None  # rank 1 answered 3.7 s in


def test_a_pending_collective_younger_than_the_threshold_is_waiting_not_a_hang():
    assert fr_hang.detect(hung(hang_after=6.0)) is None


def test_no_dumps_or_one_side_only_is_no_verdict():
    assert fr_hang.detect(hung(dumps=())) is None
    assert fr_hang.detect(hung(dumps=(WAITER,))) is None  # nobody is known to be behind
    both_pending = replace(CULPRIT, groups=WAITER.groups, entries=WAITER.entries, rank=1)
    assert fr_hang.detect(hung(dumps=(WAITER, both_pending))) is None  # a transport stall


def test_a_culprit_that_trained_on_after_its_dump_is_no_culprit():
    """rank 1 evaluated while rank 0 waited, then trained on: its old dump says nothing now."""
    dumps = (WAITER, replace(CULPRIT, step=2))
    later = hung(dumps=dumps)
    moved_on = replace(later, ranks=(later.ranks[0], replace(later.ranks[1], step=7)))
    assert fr_hang.detect(moved_on) is None
    # the step a rank records as it ends (ddpdoctor's stop included) is not training on
    ending = replace(later, ranks=(later.ranks[0], replace(later.ranks[1], step=3)))
    assert fr_hang.detect(ending).culprits == {1}
    # without the step in the answer, progress after the dump decides
    progressed = replace(later.ranks[1], last_progress_t=CULPRIT.taken_t + 1.0)
    assert fr_hang.detect(hung(dumps=(WAITER, CULPRIT))) is not None
    assert (
        fr_hang.detect(
            replace(later, ranks=(later.ranks[0], progressed), flight_recorder=(WAITER, CULPRIT))
        )
        is None
    )


def test_a_failed_dump_is_left_out():
    failed = replace(CULPRIT, groups=(), entries=(), error="no flight recorder")
    assert fr_hang.detect(hung(dumps=(WAITER, failed))) is None


def test_diagnose_gives_the_recorder_hang_as_the_verdict_and_the_section_in_json():
    snapshot = hung()
    diagnosis = diagnose(snapshot)
    assert diagnosis.verdict is Verdict.HANG and diagnosis.culprits == {1}
    section = snapshot.diagnosis_json()["flight_recorder"]
    assert section["0"]["pending"][0]["seq"] == 8 and section["1"]["pending"] == []
    assert section["1"]["groups"][0]["last_scheduled"] == 7


def test_an_events_hang_gets_the_recorder_clause_and_evidence():
    events_hang = Finding(
        id="hang",
        severity=Severity.ERROR,
        summary="rank 1 never reached all_reduce #41 of [10] float32 (rank 0 waits in it, 8 s)",
        fix="x",
        ranks=(1,),
    )
    (out,) = fr_evidence.annotate([events_hang], hung())
    assert out.summary.endswith("(flight recorder: rank 1's backend never started all_reduce #8)")
    texts = [e.text for e in out.evidence]
    assert "flight recorder, rank 1: all completed, last all_reduce #7 (float32[2372])" in texts
    assert fr_evidence.annotate([out], hung()) == (out,)  # once only


def test_a_mismatch_gets_the_first_differing_call_from_torchs_analyzer():
    dumps = (load("mismatch-gloo", 0), load("mismatch-gloo", 1))
    seq, lines = fr_evidence.first_difference(dumps, world_size=2)
    assert seq == 9
    assert lines[0].startswith(
        "flight recorder: #9 differs: rank 0 all_reduce #9 (float32[4]) vs "
        "rank 1 all_reduce #9 (int32[4]) (torch's analyzer: COLLECTIVE_DTYPE_MISMATCH"
    )
    mismatch = Finding(id="mismatch", severity=Severity.ERROR, summary="s", fix="f", ranks=(1,))
    ranks = [view(0), view(1, RankState.RUNNING)]
    (out,) = fr_evidence.annotate([mismatch], replace(snap(ranks), flight_recorder=dumps))
    assert out.summary == "s" and out.evidence[0].text == lines[0]


def test_identical_records_have_no_difference():
    other = replace(WAITER, rank=1)
    assert fr_evidence.first_difference((WAITER, other), world_size=2) is None
    assert fr_evidence.first_difference((WAITER,), world_size=2) is None


def test_the_recorders_differing_calls_are_a_mismatch_verdict():
    dumps = (load("mismatch-gloo", 0), load("mismatch-gloo", 1))
    ranks = [view(0), view(1, fault="mismatch:rank=1,step=4")]
    out = fr_mismatch.detect(replace(snap(ranks), flight_recorder=dumps))
    assert out is not None and out.verdict is Verdict.MISMATCH and out.culprits == {1}
    summary = out.findings[0].summary
    assert summary.startswith("collective mismatch at #9 (flight recorder): ")
    assert "rank 0: all_reduce #9 (float32[4])" in summary
    assert "rank 1: all_reduce #9 (int32[4])" in summary
    assert "COLLECTIVE_DTYPE_MISMATCH" in out.findings[0].evidence[0].text


def test_matching_records_are_no_mismatch():
    assert fr_mismatch.detect(hung()) is None  # one rank behind is a hang, not a mismatch


def test_a_busy_rank_behind_in_the_recorder_is_a_wait_with_its_collective():
    """rank 1 evaluates while rank 0 waits in DDP's all-reduce: no events show the wait, the
    dumps do: a wait line, no hang."""
    from ddpdoctor.monitor.model.snapshot import Activity
    from ddpdoctor.protocol.verdicts import ActivityState

    busy = Activity(ActivityState.BUSY, 99.0, "train.py:88 evaluate", 5.0)
    s = hung()
    s = replace(s, ranks=(s.ranks[0], replace(s.ranks[1], activity=busy)))
    assert fr_hang.detect(s) is None
    (w,) = wait.detect(s).waits
    assert w.waiters == (0,) and w.on == (1,) and w.busy
    assert w.collective.describe() == "all_reduce #8 of [2372] float32"
    assert w.summary.startswith("rank 0 waits 5.5 s for rank 1, busy in train.py:88 evaluate")
    diagnosis = diagnose(s)
    assert diagnosis.verdict is not Verdict.HANG and diagnosis.waits == (w,)


def test_a_recorder_wait_ends_when_the_waiter_trains_on():
    s = hung(dumps=(replace(WAITER, step=10), CULPRIT))
    out = wait.detect(s)  # the rank behind is not busy: listed, but no wait finding (a hang)
    assert [w.waiters for w in out.waits] == [(0,)] and not out.findings
    moved = replace(s, ranks=(replace(s.ranks[0], step=11), s.ranks[1]))
    assert wait.detect(moved) is None


def test_a_recorder_wait_shorter_than_the_waiting_threshold_is_not_listed():
    s = hung()
    assert wait.detect(replace(s, taken_t=WAITER.pending("0").created_t + 0.1)) is None


def test_a_healthy_jobs_dumps_are_compared_without_importing_torch():
    """Importing torch costs the monitor two seconds of CPU: on a small machine, taken from the
    ranks of a healthy job whose dumps were asked for while it started. Identical calls match
    without torch's analyzer; only a real difference asks it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ddpdoctor.monitor.judge.diagnose import diagnose\n"
        "from tests.unit.monitor.test_rules_fr_hang import WAITER, hung\n"
        "from ddpdoctor.monitor.judge import fr_evidence\n"
        "assert fr_evidence.first_difference((WAITER, WAITER), world_size=2) is None\n"
        "diagnose(hung())\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False", out.stderr
