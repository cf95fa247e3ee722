from __future__ import annotations

from ddpdoctor.monitor.judge.rules import runtime_warnings, sampler
from tests.unit.monitor.test_monitor_builders import snap, view

MSG = "epoch 1 started without DistributedSampler.set_epoch(); shuffling repeats"


def test_missing_set_epoch_warning_becomes_a_finding():
    ranks = [
        view(0, warnings=(("sampler.set_epoch_missing", MSG),)),
        view(1, warnings=(("sampler.set_epoch_missing", MSG),)),
    ]
    out = sampler.detect(snap(ranks))
    finding = out.findings[0]
    assert finding.id == "sampler.set_epoch_missing" and finding.ranks == (0, 1)
    assert "set_epoch(epoch)" in finding.fix and finding.evidence[0].text == MSG


def test_different_batch_counts_are_flagged_before_they_bite():
    out = sampler.detect(
        snap([view(0, loader_batches=((1, 12),)), view(1, loader_batches=((1, 10),))])
    )
    finding = out.findings[0]
    assert finding.id == "sampler.uneven_batches" and finding.ranks == (1,)
    assert "rank 1 10, rank 0 12" in finding.summary


def test_clean_sampler_use_gives_nothing():
    assert (
        sampler.detect(
            snap([view(0, loader_batches=((1, 10),)), view(1, loader_batches=((1, 10),))])
        )
        is None
    )


def test_a_loader_only_rank_0_makes_is_not_compared_with_the_training_loader():
    """Rank-0 evaluation (recipe_eval_checkpoint.py in the run corpus): rank 0 iterates its own
    validation loaders (ids 2, 3) between epochs; rank 1 only has the training loader (id 1)."""
    ranks = [view(0, loader_batches=((1, 20), (2, 8), (3, 8))), view(1, loader_batches=((1, 20),))]
    assert sampler.detect(snap(ranks)) is None


def test_uneven_is_found_on_any_loader_the_ranks_share():
    ranks = [view(0, loader_batches=((1, 20), (2, 5))), view(1, loader_batches=((1, 20), (2, 4)))]
    finding = sampler.detect(snap(ranks)).findings[0]
    assert finding.id == "sampler.uneven_batches" and finding.ranks == (1,)
    assert "rank 1 4, rank 0 5" in finding.summary


def test_other_runtime_warnings_are_passed_on():
    ranks = [
        view(0, warnings=(("ddp.builtin_comm_hook", "a builtin comm hook cannot be wrapped"),)),
        view(1),
    ]
    out = runtime_warnings.detect(snap(ranks))
    assert out.findings[0].id == "ddp.builtin_comm_hook" and out.findings[0].ranks == (0,)
    assert (
        runtime_warnings.detect(snap([view(0, warnings=(("sampler.set_epoch_missing", MSG),))]))
        is None
    )
