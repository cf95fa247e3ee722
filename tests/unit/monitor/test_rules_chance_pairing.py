"""A collective only some ranks make, paired with another rank's call of the same op and size
(rules/chance_pairing.py): a warning naming both sites and the step, kept once said."""

from __future__ import annotations

from ddpdoctor.monitor.judge import diagnose
from ddpdoctor.monitor.judge.rules import chance_pairing
from ddpdoctor.monitor.model.snapshot import CallSite, Verdict
from tests.unit.monitor.test_monitor_builders import coll, snap, view

TRAIN = CallSite("train.py:58 main", file="/w/train.py", line=58)
EVAL = CallSite("train.py:32 evaluate", file="/w/train.py", line=32)


def gathers(sites):
    return tuple(
        coll("all_gather_into_tensor", seq, 0.01, done=True, site=site, shapes=((64,),),
             dtypes=("float32",))
        for seq, site in enumerate(sites, start=10)
    )  # fmt: skip


def test_rank0s_eval_gather_paired_with_rank1s_training_gather_is_reported_with_both_sites():
    ranks = [
        view(0, step=10, recent_collectives=gathers([TRAIN, EVAL, TRAIN])),
        view(1, step=10, recent_collectives=gathers([TRAIN, TRAIN, TRAIN])),
    ]
    out = chance_pairing.detect(snap(ranks))
    assert out is not None and out.verdict is None
    finding = out.findings[0]
    assert finding.id == "collective.chance_pairing" and finding.severity.value == "warning"
    assert finding.ranks == (0,)
    assert "rank 0 called all_gather_into_tensor #11" in finding.summary
    assert "from train.py:32 evaluate at step 10" in finding.summary
    assert "from train.py:58 main" in finding.summary
    assert {(e.file, e.line) for e in finding.evidence if e.file} == {
        ("/w/train.py", 32),
        ("/w/train.py", 58),
    }


def test_ranks_in_step_say_nothing():
    ranks = [view(r, recent_collectives=gathers([TRAIN, TRAIN])) for r in (0, 1)]
    assert chance_pairing.detect(snap(ranks)) is None


def test_a_call_of_another_size_is_left_to_the_mismatch_rule():
    other = gathers([TRAIN, EVAL])
    other = (other[0], coll("all_gather_into_tensor", 11, 0.01, done=True, site=EVAL,
                            shapes=((8,),), dtypes=("float32",)))  # fmt: skip
    ranks = [view(0, recent_collectives=other), view(1, recent_collectives=gathers([TRAIN] * 2))]
    assert chance_pairing.detect(snap(ranks)) is None


def test_the_warning_stays_once_said():
    said: dict = {}
    paired = snap(
        [
            view(0, recent_collectives=gathers([TRAIN, EVAL, TRAIN])),
            view(1, recent_collectives=gathers([TRAIN] * 3)),
        ]
    )
    first = diagnose.keep_said(diagnose.diagnose(paired), said)
    assert first.verdict is Verdict.RUNNING
    assert [f.id for f in first.findings] == ["collective.chance_pairing"]
    later = snap([view(r, recent_collectives=gathers([TRAIN] * 3)) for r in (0, 1)])
    again = diagnose.keep_said(diagnose.diagnose(later), said)
    assert [f.id for f in again.findings] == ["collective.chance_pairing"]


def test_one_pairing_is_said_once_with_the_step_it_happened_at():
    said: dict = {}
    calls = [
        view(0, step=step, recent_collectives=gathers([TRAIN, EVAL, TRAIN])) for step in (10, 14)
    ]
    polls = [snap([c, view(1, step=10, recent_collectives=gathers([TRAIN] * 3))]) for c in calls]
    first, later = (diagnose.keep_said(diagnose.diagnose(p), said) for p in polls)
    assert [f.summary for f in later.findings] == [f.summary for f in first.findings]
    assert " at step 10," in later.findings[0].summary and len(said) == 1
