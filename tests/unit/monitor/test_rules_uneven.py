from __future__ import annotations

from ddpdoctor.monitor.judge.rules import uneven
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, snap, view


def test_different_loader_lengths_when_a_problem_hits():
    ranks = [view(0, step=11, epoch_batches=12), view(1, step=10, epoch_batches=10)]
    out = uneven.detect(snap(ranks), Verdict.HANG)
    finding = out.findings[0]
    assert finding.id == "uneven_inputs" and "uneven inputs" in finding.summary
    assert (
        "DistributedSampler" in finding.fix and "Join" in finding.fix and "drop_last" in finding.fix
    )
    assert finding.ranks == (1,)


def test_a_rank_that_finished_early():
    ranks = [view(0, step=11), view(1, RankState.DONE, step=10, exit_code=0)]
    assert uneven.detect(snap(ranks), Verdict.CRASH) is not None


def test_step_counts_far_apart():
    assert uneven.detect(snap([view(0, step=14), view(1, step=10)]), Verdict.HANG) is not None


def test_one_step_apart_is_normal_at_a_hang():
    assert uneven.detect(snap([view(0, step=11), view(1, step=10)]), Verdict.HANG) is None


def test_only_reported_with_a_problem():
    ranks = [view(0, step=14, epoch_batches=12), view(1, step=10, epoch_batches=10)]
    assert uneven.detect(snap(ranks), Verdict.RUNNING) is None


def test_a_rank_that_died_is_not_uneven_inputs():
    """Rank 1 was SIGKILLed at step 40 while rank 0 went on to step 42 before torchrun stopped
    it: a crash of rank 1, and nothing about the data."""
    from ddpdoctor.monitor.judge.diagnose import diagnose

    ranks = [
        view(0, RankState.FAILED, step=42, exit_code=-15, exit_signal="SIGTERM",
             exit_reason="signal", failed_t=NOW - 1, alive=False),
        view(1, RankState.GONE, step=40, exit_signal="SIGKILL", failed_t=NOW - 5, alive=False),
    ]  # fmt: skip
    diagnosis = diagnose(snap(ranks))
    assert diagnosis.verdict is Verdict.CRASH and diagnosis.culprits == frozenset({1})
    assert not [f for f in diagnosis.findings if f.id == "uneven_inputs"]


def test_a_dead_culprit_still_leaves_uneven_loaders_to_report():
    ranks = [view(0, step=11, epoch_batches=12), view(1, RankState.GONE, step=10, epoch_batches=10)]
    assert uneven.detect(snap(ranks), Verdict.CRASH, died=frozenset({1})) is None
    ranks.append(view(2, step=9, epoch_batches=10))
    assert uneven.detect(snap(ranks), Verdict.CRASH, died=frozenset({1})) is not None


def test_the_loaders_name_the_short_rank_whatever_step_the_stop_caught_each_in():
    """Rank 1's loader had 16 batches, rank 0's 20: rank 1 waits at the closing barrier after
    step 16 while rank 0 is stopped inside step 17, which it never finished."""
    ranks = [
        view(0, RankState.FAILED, step=16, epoch_batches=20, exit_signal="SIGTERM"),
        view(1, RankState.FAILED, step=16, epoch_batches=16, exit_signal="SIGTERM"),
    ]
    finding = uneven.detect(snap(ranks), Verdict.MISMATCH).findings[0]
    assert finding.ranks == (1,)
    assert finding.summary == "uneven inputs: rank 1 had 16 batches this epoch while rank 0 had 20"


def test_a_loader_only_one_rank_went_through_is_no_uneven_input():
    """Rank 0 alone evaluates at an epoch's end (an eval loader of 2 batches, its latest epoch
    event); both ranks' training loader had 4 batches: no rank is short of training data."""
    ranks = [
        view(0, step=4, epoch_batches=2, loader_batches=((0, 4), (1, 2))),
        view(1, step=4, epoch_batches=4, loader_batches=((0, 4),)),
    ]
    assert uneven.detect(snap(ranks), Verdict.MISMATCH) is None
    short = [
        view(0, step=4, epoch_batches=2, loader_batches=((0, 4), (1, 2))),
        view(1, step=4, epoch_batches=3, loader_batches=((0, 3),)),
    ]
    out = uneven.detect(snap(short), Verdict.MISMATCH)
    assert out is not None and out.findings[0].ranks == (1,)
    assert "3 batches this epoch while rank 0 had 4" in out.findings[0].summary
