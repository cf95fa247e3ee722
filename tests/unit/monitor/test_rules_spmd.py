"""The SPMD rules: a contract that differs across ranks, and a rank that syncs DDP gradients more
often than a peer that finished (ddpdoctor/monitor/judge/rules/contract.py, grad_syncs.py)."""

from __future__ import annotations

from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import contract, grad_syncs
from ddpdoctor.monitor.model.snapshot import CallSite, RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, coll, snap, view

MESSAGE = (
    "the ranks differ in the SPMD contract of the FSDP model Net (fully_shard at train.py:70 "
    "(main)): rank 1 has unit head (cpu mesh [2] dims shard, 2 parameters) made at train.py:69 "
    f"(main); rank 0 not [culprits 1; line /src/train.py:69; t {NOW - 3.0:.3f}]"
)


def test_contract_message_is_parsed_into_culprits_line_and_time():
    summary, culprits, file, line, t = contract.parse(MESSAGE)
    assert summary.endswith("rank 0 not") and "[culprits" not in summary
    assert culprits == (1,) and (file, line) == ("/src/train.py", 69) and t == NOW - 3.0
    assert contract.parse("no bracket") == ("no bracket", (), None, None, None)
    assert contract.parse("x [culprits a,b; line nowhere; t soon]")[1:] == ((), None, None, None)


def test_a_differing_contract_is_a_mismatch_of_its_culprit_before_the_crash_it_causes():
    warned = view(0, warnings=((contract.CODE, MESSAGE),), step=0)
    died = view(1, RankState.FAILED, step=0, exit_code=-6, failed_t=NOW - 2.5, alive=False)
    diagnosis = diagnose(snap([warned, died]))
    assert diagnosis.verdict is Verdict.MISMATCH and diagnosis.culprits == {1}
    finding = diagnosis.findings[0]
    assert finding.id == contract.CODE and finding.severity.value == "error"
    assert (finding.evidence[0].file, finding.evidence[0].line) == ("/src/train.py", 69)
    assert [f.id for f in diagnosis.findings].count(contract.CODE) == 1  # not again as a warning


def test_no_contract_warning_no_outcome():
    assert contract.detect(snap([view(0), view(1)])) is None


SYNCS = "default" + grad_syncs.SUFFIX
SITE = CallSite("acc.py:38 main", file="/src/acc.py", line=38)


def synced(rank: int, count: int, **kw):
    recent = tuple(
        coll("ddp_gradient_sync", s, 0.0, group=SYNCS, done=True, site=SITE, shapes=(), dtypes=())
        for s in range(1, count + 1)
    )
    return view(rank, group_seqs=((SYNCS, count),), recent_collectives=recent, **kw)


def test_a_rank_that_syncs_again_after_its_peer_finished_is_the_culprit_at_the_no_sync_line():
    finished = synced(0, 2, state=RankState.DONE, exit_code=0, alive=False)
    failed = synced(1, 3, state=RankState.FAILED, exit_code=1, failed_t=NOW, alive=False)
    outcome = grad_syncs.detect(snap([finished, failed]))
    assert outcome is not None and outcome.verdict is Verdict.MISMATCH
    assert outcome.culprits == {1}
    finding = outcome.findings[0]
    assert "3 times" in finding.summary and "only 2 times" in finding.summary
    assert (finding.evidence[0].file, finding.evidence[0].line) == ("/src/acc.py", 38)


def test_equal_counts_or_everyone_finished_is_no_finding():
    done = dict(state=RankState.DONE, exit_code=0, alive=False)
    assert grad_syncs.detect(snap([synced(0, 2, **done), synced(1, 3, **done)])) is None
    assert grad_syncs.detect(snap([synced(0, 2, **done), synced(1, 2)])) is None
    assert grad_syncs.detect(snap([synced(0, 2), synced(1, 3)])) is None


def test_a_peer_stopped_after_the_extra_sync_failed_still_counts_as_ended():
    """On a busy machine torchrun's SIGTERM can reach rank 0 (fewer syncs, finishing) before
    its clean exit: the verdict is the same as when its exit landed first."""
    blames = "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1"
    ahead = synced(1, 3, state=RankState.FAILED, exit_code=1, error=blames, failed_t=NOW - 1)
    stopped = synced(
        0,
        2,
        state=RankState.FAILED,
        exit_code=-15,
        exit_signal="SIGTERM",
        failed_t=NOW,
        alive=False,
    )
    outcome = grad_syncs.detect(snap([stopped, ahead]))
    assert outcome is not None and outcome.culprits == {1}
    diagnosis = diagnose(snap([stopped, ahead]))
    assert diagnosis.verdict is Verdict.MISMATCH and diagnosis.culprits == {1}


def test_a_real_crash_or_a_stop_of_every_rank_is_no_sync_mismatch():
    blames = "RuntimeError: Connection closed by peer [127.0.0.1]:1"
    ahead = synced(1, 3, state=RankState.FAILED, exit_code=1, error=blames, failed_t=NOW)
    crashed = synced(
        0, 2, state=RankState.FAILED, exit_code=1, error="ValueError: bad", failed_t=NOW - 1
    )
    assert grad_syncs.detect(snap([crashed, ahead])) is None
    sigint = dict(state=RankState.FAILED, exit_code=-2, exit_signal="SIGINT", failed_t=NOW)
    assert grad_syncs.detect(snap([synced(0, 2, **sigint), synced(1, 3, **sigint)])) is None


def test_the_flight_recorders_barrier_against_an_all_reduce_names_the_rank_that_synced_more():
    """Rank 0 finished its loop and waits in the end's barrier; rank 1 (accumulating over fewer
    micro-batches) synced twice more: rank 1 made the extra call."""
    ranks = [synced(0, 6), synced(1, 8)]
    outcome = grad_syncs.extra_syncs(snap(ranks), [1], [0])
    assert outcome is not None and outcome.culprits == {1}
    assert "8 times" in outcome.findings[0].summary
    assert grad_syncs.extra_syncs(snap(ranks), [0], [1]) is None


def test_one_sync_ahead_is_left_to_the_call_sites():
    """Rank 1 stopped before its forward for a barrier only it makes (the reference job's
    injected mismatch); rank 0 went on to the step's forward and gradient all-reduce: one sync
    ahead, which the counts cannot tell from a rank that accumulates differently; the steps'
    forwards (one each on both ranks, or not known) say nothing either."""
    assert grad_syncs.extra_syncs(snap([synced(0, 4), synced(1, 3)]), [0], [1]) is None
    alike = [synced(0, 4, step_forwards=1), synced(1, 3, step_forwards=1)]
    assert grad_syncs.extra_syncs(snap(alike), [0], [1]) is None
    half_known = [synced(0, 4, step_forwards=1), synced(1, 3)]
    assert grad_syncs.extra_syncs(snap(half_known), [0], [1]) is None


def test_one_sync_ahead_after_fewer_forwards_per_step_is_the_accumulation_difference():
    """Rank 1 accumulates over 2 micro-batches, rank 0 over 4 (ddp_accum_config.py): rank 0
    ended its loop after 6 syncs and waits in the end's barrier, rank 1 is in its 7th. Its
    steps have fewer forwards: rank 1 made the extra call, at the line deciding its syncs."""
    ranks = [synced(0, 6, step_forwards=4), synced(1, 7, step_forwards=2)]
    outcome = grad_syncs.extra_syncs(snap(ranks), [1], [0])
    assert outcome is not None and outcome.culprits == {1}
    assert (outcome.findings[0].evidence[0].file, outcome.findings[0].evidence[0].line) == (
        "/src/acc.py",
        38,
    )
    assert grad_syncs.extra_syncs(snap(ranks), [0], [1]) is None
    # the rank ahead with as many forwards per step or more is a step ahead, not the culprit
    ahead = [synced(0, 4, step_forwards=2), synced(1, 3, step_forwards=2)]
    assert grad_syncs.extra_syncs(snap(ahead), [0], [1]) is None


def test_an_extra_call_through_a_framework_gets_that_frameworks_fix():
    from ddpdoctor.monitor.judge.rules import framework_fix

    gather = CallSite(
        "m.py:19 evaluate", via="accelerate/accelerator.py:3151 Accelerator.gather_for_metrics"
    )
    assert "accelerator.gather_for_metrics" in framework_fix.for_site(gather)
    wait = CallSite(
        "m.py:38 main", via="accelerate/accelerator.py:3310 Accelerator.wait_for_everyone"
    )
    assert framework_fix.with_framework("Generic.", wait).startswith(
        "Accelerate: call accelerator.wait"
    )
    barrier = CallSite(
        "lit.py:24 M.on_train_epoch_end",
        via="lightning/pytorch/strategies/ddp.py:1 DDPStrategy.barrier",
    )
    assert "strategy.barrier()" in framework_fix.for_site(barrier)
    unit = CallSite("m.py:25 Model.forward", via="m.py:32 fully_shard[probe]")
    assert "FSDP2" in framework_fix.for_site(unit)
    assert framework_fix.with_framework("Generic.", CallSite("m.py:3 main")) == "Generic."


def test_lightnings_unused_parameter_error_is_explained_with_lightnings_spelling():
    from ddpdoctor.explain.ddp import RULES

    rule = next(r for r in RULES if r.id == "ddp.unused_parameters")
    line = (
        "RuntimeError: It looks like your LightningModule has parameters that were not used in "
        "producing the loss returned by training_step."
    )
    match = rule.pattern.search(line)
    assert match is not None
    fix = rule.fix(match.groupdict()) if callable(rule.fix) else rule.fix
    assert fix.index('strategy="ddp_find_unused_parameters_true"') < fix.index("plain DDP")


def test_a_rank_evaluating_alone_while_its_peer_synced_on_is_not_a_sync_mismatch():
    """accelerate's gather_for_metrics under is_main_process at an epoch's end: rank 0 is in
    its all_gather (evaluating, epoch 0), rank 1 already in epoch 1's first gradient sync."""
    ranks = [synced(0, 4, phase="eval", epoch=0), synced(1, 5, phase="train", epoch=1)]
    assert grad_syncs.extra_syncs(snap(ranks), [1], [0]) is None
    ranks = [synced(0, 4, phase="train", epoch=1), synced(1, 5, phase="train", epoch=2)]
    assert grad_syncs.extra_syncs(snap(ranks), [1], [0]) is None
