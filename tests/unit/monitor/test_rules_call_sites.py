"""Call sites in diagnoses: the first collective whose sites differ between ranks names the rank
that made an extra call and its line, even where the transport paired two different calls."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.monitor.judge.rules import call_sites, hang, mismatch
from ddpdoctor.monitor.model.snapshot import CallSite, RankState, Verdict
from tests.unit.monitor.test_monitor_builders import coll, snap, view, waiting

FIT = CallSite("lit_job.py:40 main", "trainer.py:561 Trainer.fit", "ddp.py:303 DDPStrategy.barrier")
SYNC = CallSite("lit_job.py:40 main", "trainer.py:561 Trainer.fit", "distributed.py:213 _sync_ddp")
GUARDED = CallSite(
    "lit_job.py:27 Model.on_train_epoch_end",
    "ddp.py:303 DDPStrategy.barrier",
    file="/home/me/lit_job.py",
    line=27,
)


def calls(*ops_sites, start=10, done=True):
    return tuple(
        coll(op, start + i, 0.01, done=done, site=site) for i, (op, site) in enumerate(ops_sites)
    )


def lightning_ranks():
    """Rank 0 made an extra barrier at #12 (gloo paired it with rank 1's barrier of the epoch's
    metric reduction); a call later rank 0 is in that barrier, rank 1 in the all_reduce after."""
    r0_recent = calls(("barrier", FIT), ("barrier", FIT), ("barrier", GUARDED), ("barrier", SYNC))
    r1_recent = calls(("barrier", FIT), ("barrier", FIT), ("barrier", SYNC), ("all_reduce", SYNC))
    r0 = view(0, RankState.WAITING, recent_collectives=r0_recent, collective=r0_recent[-1], seq=13)
    r1 = view(1, RankState.WAITING, recent_collectives=r1_recent, collective=r1_recent[-1], seq=13)
    return r0, r1


def test_an_extra_barrier_paired_by_gloo_is_blamed_on_the_rank_that_made_it():
    out = mismatch.detect(snap(list(lightning_ranks())))
    assert out is not None and out.verdict is Verdict.MISMATCH
    assert out.culprits == {0}
    finding = out.findings[0]
    assert finding.summary.startswith(
        "collective mismatch at #12: rank 0 called barrier #12 from lit_job.py:27 "
        "Model.on_train_epoch_end via DDPStrategy.barrier; rank 1 never did"
    )
    assert (finding.evidence[0].file, finding.evidence[0].line) == ("/home/me/lit_job.py", 27)
    assert any("then at #13" in e.text for e in finding.evidence)


def test_without_sites_the_rule_judges_by_the_calls_alone():
    ranks = [
        replace(r, recent_collectives=tuple(replace(c, site=None) for c in r.recent_collectives))
        for r in lightning_ranks()
    ]
    out = mismatch.detect(snap(ranks))
    assert out is not None and "called barrier #12 from" not in out.findings[0].summary


def test_the_same_collective_from_different_lines_is_no_divergence():
    """The tutorial's download barrier: rank 0 calls it after the download, the others before
    it, from two lines; the calls pair as meant and must not be blamed."""
    before = CallSite("train.py:30 main")
    after = CallSite("train.py:33 main")
    step = CallSite("train.py:50 main")
    r0 = view(0, recent_collectives=calls(("barrier", after), ("all_reduce", step)), seq=11)
    r1 = view(1, recent_collectives=calls(("barrier", before), ("all_reduce", step)), seq=11)
    assert call_sites.first_divergence(snap([r0, r1])) is None


def test_healthy_lightning_ranks_have_no_divergence():
    same = calls(("barrier", FIT), ("barrier", SYNC), ("all_reduce", SYNC))
    ranks = [view(0, recent_collectives=same, seq=12), view(1, recent_collectives=same, seq=12)]
    assert call_sites.first_divergence(snap(ranks)) is None
    assert mismatch.detect(snap(ranks)) is None


def test_a_waiting_rank_whose_peer_finished_without_that_call_is_the_culprit():
    """`if rank == 0: barrier()` at the very end: rank 1 ended cleanly after #11, rank 0 waits
    in #12 from a line rank 1 never called from."""
    r1 = view(
        1,
        RankState.DONE,
        recent_collectives=calls(("barrier", FIT), ("barrier", SYNC)),
        seq=11,
        exit_code=0,
        alive=False,
    )
    extra = coll("barrier", 12, 8.0, site=GUARDED)
    r0 = replace(
        waiting(0, 12, 8.0, op="barrier"),
        collective=extra,
        recent_collectives=(*calls(("barrier", FIT), ("barrier", SYNC)), extra),
    )
    out = hang.detect(snap([r0, r1]))
    assert out is not None and out.culprits == {0}
    assert out.findings[0].summary.startswith(
        "rank 0 called barrier #12 from lit_job.py:27 Model.on_train_epoch_end via "
        "DDPStrategy.barrier; rank 1 never did (it finished after #11)"
    )


def test_a_peer_that_finished_after_the_same_calls_stays_the_culprit():
    """Uneven data: rank 0's call at #12 is the loop's usual one, which rank 1 made too."""
    step = CallSite("train.py:50 main")
    r1 = view(
        1,
        RankState.DONE,
        recent_collectives=calls(("all_reduce", step), ("all_reduce", step)),
        seq=11,
        exit_code=0,
        alive=False,
    )
    r0 = replace(waiting(0, 12, 8.0), collective=coll("all_reduce", 12, 8.0, site=step))
    out = hang.detect(snap([r0, r1]))
    assert out is not None and out.culprits == {1}


def test_open_extra_names_the_side_in_a_call_from_a_line_the_others_never_used():
    log = CallSite("lit_job.py:22 Model.training_step", "module.py:531 LightningModule.log")
    r0 = view(0, RankState.WAITING, collective=coll("barrier", 12, 3.0, site=log), seq=11)
    r1 = view(1, recent_collectives=calls(("broadcast", FIT)), seq=11)
    found = call_sites.open_extra(snap([r0, r1]), [0], [1], "all_reduce #16 (float32[18])")
    assert found is not None and found.culprits == (0,)
    assert "via LightningModule.log; rank 1 never did (it is in all_reduce #16" in found.describe()
    assert call_sites.open_extra(snap([r0, r1]), [1], [0]) is None


def test_a_rank_that_failed_in_an_extra_call_after_its_peer_ended_is_named_at_its_line():
    """`if self.global_rank == 0: strategy.barrier()` in the last epoch: rank 1 finishes, rank 0
    waits in the barrier until gloo fails it with "Connection closed by peer"."""
    from ddpdoctor.monitor.judge.rules import crash

    r1 = view(
        1,
        RankState.DONE,
        recent_collectives=calls(("barrier", FIT), ("broadcast", SYNC)),
        seq=11,
        exit_code=0,
        alive=False,
    )
    r0 = view(
        0,
        RankState.FAILED,
        error="RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:41902",
        collective=coll("barrier", 12, 2.0, site=GUARDED),
        recent_collectives=calls(("barrier", FIT), ("broadcast", SYNC)),
        seq=11,
        failed_t=1.0,
    )
    out = crash.detect(snap([r0, r1]))
    assert out is not None and out.culprits == {0}
    summary = out.findings[0].summary
    assert summary.startswith(
        "rank 0 called barrier #12 from lit_job.py:27 Model.on_train_epoch_end via "
        "DDPStrategy.barrier; rank 1 never did (it finished after #11); rank 0 then failed: "
        "RuntimeError: [pair.cc:561] Connection closed by peer"
    ), summary
    assert out.findings[0].evidence[0].line == 27


def test_a_metric_synced_later_on_rank_0_alone_is_named_at_its_log_line():
    """lit_log_rank0.py: `self.log("val_loss", loss, sync_dist=True)` under `if self.global_rank
    == 0` in validation_step. Lightning syncs it at the validation epoch's end: rank 0's barrier
    carries the log line (deferred), rank 1 has gone on to the next epoch's first broadcast, which
    rank 0 made too before. Without the deferred site both barriers read `main via Trainer.fit >
    _sync_ddp` and the ranks looked alike."""
    sigterm = CallSite("lit.py:47 <module>", "trainer.py:584 Trainer.fit", "loop.py:265 _broadcast")
    logged = CallSite(
        "lit.py:23 Model.validation_step", "module.py:531 LightningModule.log",
        file="/home/me/lit.py", line=23, deferred=True,
    )  # fmt: skip
    r0_recent = calls(("barrier", SYNC), ("all_reduce", SYNC), ("broadcast", sigterm))
    r1_recent = calls(("barrier", SYNC), ("all_reduce", SYNC), ("broadcast", sigterm))
    r0_open = coll("barrier", 13, 2.0, site=logged)
    r1_open = coll("broadcast", 13, 2.0, site=sigterm)
    r0 = view(0, RankState.WAITING, recent_collectives=r0_recent, collective=r0_open, seq=13)
    r1 = view(1, RankState.WAITING, recent_collectives=r1_recent, collective=r1_open, seq=13)
    out = mismatch.detect(snap([r0, r1]))
    assert out is not None and out.culprits == {0}
    summary = out.findings[0].summary
    assert (
        "rank 0 called barrier #13 from lit.py:23 Model.validation_step via LightningModule.log"
        in (summary)
    )
    assert ", synced later by the framework; rank 1 never did" in summary
    assert (out.findings[0].evidence[0].file, out.findings[0].evidence[0].line) == (
        "/home/me/lit.py",
        23,
    )
    assert logged.to_json()["deferred"] is True and "deferred" not in SYNC.to_json()


def test_the_extra_calls_evidence_names_the_users_line_that_called_its_helper():
    from ddpdoctor.monitor.model.event_fields import call_site

    site = call_site(
        {
            "file": "/job/ckpt.py",
            "line": 19,
            "function": "save_checkpoint",
            "via": None,
            "caller": {"file": "/job/ckpt.py", "line": 37, "function": "train"},
        }
    )
    assert site is not None and site.caller == "ckpt.py:37 train"
    extra = coll("all_gather_single", 81, 1.0, site=site)
    divergence = call_sites.Divergence("default", 81, (0,), extra, (1,), None)
    cited = [(e.file, e.line) for e in divergence.evidence()]
    assert ("/job/ckpt.py", 19) in cited and ("/job/ckpt.py", 37) in cited
