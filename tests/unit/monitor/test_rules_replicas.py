"""The replicas rule: digests of one step compared across ranks, the divergence's first step,
ranks, tensors and call (ddpdoctor/monitor/judge/rules/replicas.py), folded from events as the
monitor reads them (ddpdoctor/monitor/model/replicas.py)."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings import Severity
from ddpdoctor.launch.supervise import StopPolicy
from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.judge.rules import replicas
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.replicas import MAX_KEPT, ReplicaTrack
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, snap, view

NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]
LOAD_SITE = {"file": "/src/train.py", "line": 57, "function": "main", "via": None}
SCHED_SITE = {"file": "/src/train.py", "line": 40, "function": "train", "via": None}


def event(step: int, digests: list[int], calls: list[dict[str, Any]] = (), **kw: Any) -> dict:
    e = {
        "v": 1,
        "t": NOW - 10 + step / 100,
        "rank": 0,
        "kind": "replica_digest",
        "model": 0,
        "step": step,
        "final": False,
        "buffers": False,
        "sync_buffers": True,
        "digests": digests,
        "calls": list(calls),
        "names": NAMES,
    }
    e.update(kw)
    return e


def call(what: str, site: dict, count: int, steps: list[int]) -> dict[str, Any]:
    return {"what": what, "site": site, "ddp": True, "count": count, "steps": steps}


def digests_of(events: list[dict]) -> tuple:
    track = ReplicaTrack()
    for e in events:
        track.apply(e)
    return track.view()


SAME = [11, 12, 13, 14]
LOAD = call("DistributedDataParallel.load_state_dict", LOAD_SITE, 1, [20])


def reload_job() -> list:
    """Rank 0 reloaded its weights at step 20: agreed at 0, 8, 16; differ from 24 on."""
    r0 = [event(s, SAME) for s in (0, 8, 16)] + [
        event(24, [99, 98, 13, 14], [LOAD]),
        event(32, [97, 96, 13, 14], [LOAD]),
    ]
    r1 = [event(s, SAME) for s in (0, 16)] + [event(s, SAME) for s in (24, 32)]
    return [
        view(0, replica_digests=digests_of(r0)),
        view(1, replica_digests=digests_of(r1)),
    ]


def test_a_reload_on_rank_0_is_a_divergence_naming_the_rank_the_step_and_the_line():
    diagnosis = diagnose(snap(reload_job()))
    assert diagnosis.verdict is Verdict.MISMATCH
    assert not diagnosis.confirmed  # it does not hang: not stopped unless asked
    finding = diagnosis.findings[0]
    assert finding.id == replicas.DIVERGED and finding.severity is Severity.ERROR
    assert finding.ranks == (0,)
    assert "from step 24, after agreeing at step 16" in finding.summary
    assert "2 of 4 tensors" in finding.summary and "0.weight" in finding.summary
    assert "2.weight" not in finding.summary.split("differ (")[1].split(")")[0]
    assert (
        "rank 0 called DistributedDataParallel.load_state_dict at train.py:57 main at step 20 "
        "(rank 1 never did)" in finding.summary
    )
    assert (finding.evidence[0].file, finding.evidence[0].line) == ("/src/train.py", 57)


def test_a_scheduler_stepped_on_one_rank_is_cited_over_the_calls_every_rank_made():
    opt = call("SGD.step", SCHED_SITE | {"line": 38}, 8, [1, 2, 3])
    init = call("StepLR.step", SCHED_SITE | {"line": 30}, 1, [0])
    sched = call("StepLR.step", SCHED_SITE, 8, [1, 2, 3, 4, 5, 6, 7, 8])
    r0 = [event(0, SAME, [init]), event(8, [1, 2, 3, 4], [init, opt, sched])]
    r1 = [event(0, SAME, [init]), event(8, [5, 6, 7, 8], [init, opt])]
    views = [view(0, replica_digests=digests_of(r0)), view(1, replica_digests=digests_of(r1))]
    finding = diagnose(snap(views)).findings[0]
    assert finding.ranks == (0,)
    assert "rank 0 called StepLR.step at train.py:40 train 8 times, from step 1" in finding.summary


def test_with_three_ranks_the_minority_differs_and_ties_blame_the_call_maker():
    r = [event(0, SAME), event(8, SAME)]
    odd = [event(0, SAME), event(8, [1, 12, 13, 14], [LOAD])]
    views = [
        view(0, replica_digests=digests_of(r)),
        view(1, replica_digests=digests_of(odd)),
        view(2, replica_digests=digests_of(r)),
    ]
    finding = diagnose(snap(views)).findings[0]
    assert finding.ranks == (1,)
    assert "rank 1's replica differs from the other ranks'" in finding.summary
    assert "1 of 4 tensors" in finding.summary


def test_identical_digests_and_healthy_jobs_give_no_divergence():
    r = [event(s, SAME) for s in (0, 1, 8, 16)]
    views = [view(0, replica_digests=digests_of(r)), view(1, replica_digests=digests_of(r))]
    diagnosis = diagnose(snap(views))
    assert diagnosis.verdict is not Verdict.MISMATCH
    assert not [f for f in diagnosis.findings if f.id.startswith("replicas.")]


def test_only_steps_both_ranks_digested_and_tensors_both_digested_are_compared():
    # rank 0 digested its buffers too (it had just synced them), rank 1 not: compare params
    r0 = [event(8, [*SAME, 5], names=[*NAMES, "1.running_mean"], buffers=True)]
    r1 = [event(8, SAME), event(16, [0, 0, 0, 0])]  # step 16: rank 0 has none
    views = [view(0, replica_digests=digests_of(r0)), view(1, replica_digests=digests_of(r1))]
    assert replicas.detect(snap(views)) is None


def test_a_crash_stays_the_verdict_and_buffers_not_broadcast_are_an_info():
    views = reload_job()
    views[1] = view(
        1,
        RankState.FAILED,
        exit_code=1,
        failed_t=NOW - 1,
        error="RuntimeError: boom",
        replica_digests=views[1].replica_digests,
    )
    assert diagnose(snap(views)).verdict is Verdict.CRASH
    r = [event(0, SAME, sync_buffers=False)]
    infos = diagnose(snap([view(0, replica_digests=digests_of(r))])).findings
    assert [f.id for f in infos if f.id.startswith("replicas")] == [replicas.BUFFERS_OFF]


def test_after_the_fact_the_end_says_agreed_or_how_they_diverged():
    agreed = [event(0, SAME), event(200, SAME, final=True)]
    ranks = [(0, digests_of(agreed)), (1, digests_of(agreed))]
    (end,) = replicas.at_end(ranks)
    assert end.id == replicas.AGREED_AT_END and "(step 200)" in end.summary
    views = reload_job()
    ranks = [(v.rank, v.replica_digests) for v in views]
    (end,) = replicas.at_end(ranks)  # no final digests: the last shared step decides
    assert end.id == replicas.DIVERGED and end.ranks == (0,)


def test_a_stop_on_divergence_only_when_the_user_asked():
    views = reload_job()
    judged = apply_diagnosis(snap(views), diagnose(snap(views)))
    clock = [0.0]
    polite = StopPolicy(keep_running=False, clock=lambda: clock[0])
    asked = StopPolicy(keep_running=False, clock=lambda: clock[0], stop_on_divergence=True)
    for _ in range(40):
        clock[0] += 1.0
        assert polite.observe(judged, job_running=True).stop is None
        decision = asked.observe(judged, job_running=True)
    assert decision.stop is None and asked.stopped_for is Verdict.MISMATCH


def test_bad_digest_events_are_dropped_and_the_kept_digests_stay_bounded():
    track = ReplicaTrack()
    track.apply(event(0, [1, 2]))  # 2 digests for 4 names
    track.apply(event(0, ["a", 1, 2, 3]))
    track.apply(event(-1, SAME))
    track.apply({**event(0, SAME), "model": True})
    assert track.view() == ()
    for step in range(0, 8 * (MAX_KEPT + 100), 8):
        track.apply(event(step, SAME))
    kept = [d.step for d in track.view()]
    assert len(kept) <= MAX_KEPT and kept[0] == 0 and kept[-1] == 8 * (MAX_KEPT + 99)
    tracker = RankTracker(0)
    tracker.apply(event(8, SAME))
    assert [d.step for d in tracker.replicas.view()] == [8]


def replicas_said(diagnosis: Any) -> list:
    return [f for f in diagnosis.findings if f.id.startswith("replicas.")] + (
        [diagnosis.verdict] if diagnosis.verdict is Verdict.MISMATCH else []
    )


def hsdp(rank: int, step: int, digests: list[int], peers: list[int], **kw: Any) -> dict:
    return event(step, digests, replica="hsdp", peers=peers, rank=rank, **kw)


def test_hsdp_replicate_groups_are_compared_apart_and_a_drifting_group_is_named():
    """2x2 HSDP: ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1. Different shards are no
    divergence; rank 0's shard drifting from rank 2's is, in the group of ranks 0, 2."""
    shard0, shard1 = [1, 2, 3, 4], [5, 6, 7, 8]
    views = [
        view(r, replica_digests=digests_of([hsdp(r, s, d, p) for s in (0, 8, 16)]))
        for r, d, p in ((0, shard0, [0, 2]), (1, shard1, [1, 3]), (2, shard0, [0, 2]))
    ]
    views.append(view(3, replica_digests=digests_of([hsdp(3, s, shard1, [1, 3]) for s in (0, 8)])))
    assert not replicas_said(diagnose(snap(views)))
    ends = replicas.at_end(replicas.of_snapshot(snap(views)))
    assert [f.id for f in ends] == [replicas.AGREED_AT_END] * 2  # one per replicate group
    sched = call("StepLR.step", SCHED_SITE, 7, [1, 2, 3, 4, 5, 6, 7])
    drift = [hsdp(0, 0, shard0, [0, 2]), hsdp(0, 8, [9, 2, 3, 4], [0, 2], calls=[sched])]
    views[0] = view(0, replica_digests=digests_of(drift))
    diagnosis = diagnose(snap(views))
    assert diagnosis.verdict is Verdict.MISMATCH and diagnosis.culprits == frozenset({0})
    finding = diagnosis.findings[0]
    assert "from step 8, after agreeing at step 0" in finding.summary
    assert "1 of 4 tensors of the HSDP model's shards (replicate group ranks 0, 2)" in (
        finding.summary
    )
    assert "rank 0 called StepLR.step at train.py:40" in finding.summary
    # a rank whose peers leave itself out is not compared (nothing to believe)
    odd = view(4, replica_digests=digests_of([hsdp(4, 0, [0, 0, 0, 0], [0, 2])]))
    assert replicas.partitions(replicas.of_snapshot(snap([*views, odd])), 0)[0][0][0] == 0


def test_a_divergence_seen_only_in_the_final_digests_is_found_live():
    """Fast steps space the digests far apart: after steps 0 and 1 the next may be the end."""
    r0 = [event(0, SAME), event(1, SAME), event(200, [1, 12, 13, 14], [LOAD], final=True)]
    r1 = [event(0, SAME), event(1, SAME), event(200, SAME, final=True)]
    views = [view(0, replica_digests=digests_of(r0)), view(1, replica_digests=digests_of(r1))]
    diagnosis = diagnose(snap(views))
    assert diagnosis.verdict is Verdict.MISMATCH and diagnosis.culprits == frozenset({0})
    summary = diagnosis.findings[0].summary
    assert "from step 200, after agreeing at step 1 (the digests taken as the training" in summary
    assert "rank 0 called DistributedDataParallel.load_state_dict" in summary


def zero(step: int, calls: list[dict] = (), **kw: Any) -> dict:
    return event(step, SAME, calls, replica="zero", **kw)


def test_zero_replicas_that_agree_while_one_rank_steps_its_scheduler_are_updates_differing():
    sched = call("ExponentialLR.step", SCHED_SITE, 1, [1])
    later = call("ExponentialLR.step", SCHED_SITE, 64, [1, 2, 3, 4, 5, 6, 7, 8])
    r0 = [zero(0), zero(1, [sched]), zero(64, [later])]
    r1 = [zero(0), zero(1), zero(64)]
    views = [view(0, replica_digests=digests_of(r0)), view(1, replica_digests=digests_of(r1))]
    diagnosis = diagnose(snap(views))
    assert diagnosis.verdict is Verdict.MISMATCH and diagnosis.culprits == frozenset({0})
    assert not diagnosis.confirmed
    finding = diagnosis.findings[0]
    assert finding.id == "replicas.updates_differ" and finding.severity is Severity.ERROR
    assert "the ZeRO optimizer's parameters agree at step 1" in finding.summary
    assert "ExponentialLR.step at train.py:40 train 64 times, from step 1 (rank 1 never did)" in (
        finding.summary
    )
    # the same calls on a DDP model's digests (no ZeRO): nothing (its digests would differ)
    ddp = [
        [event(s, SAME, c) for s, c in ((0, []), (1, [sched]))],
        [event(0, SAME), event(1, SAME)],
    ]
    views = [view(r, replica_digests=digests_of(ev)) for r, ev in enumerate(ddp)]
    assert not replicas_said(diagnose(snap(views)))
    # a load into something else than the model (a rank-0 evaluation copy): not counted
    other = dict(call("Net.load_state_dict", LOAD_SITE, 1, [5]), ddp=False)
    views = [
        view(0, replica_digests=digests_of([zero(0), zero(8, [other])])),
        view(1, replica_digests=digests_of([zero(0), zero(8)])),
    ]
    assert not replicas_said(diagnose(snap(views)))


def test_zero_updates_differing_stop_the_job_only_when_asked():
    sched = call("ExponentialLR.step", SCHED_SITE, 1, [1])
    views = [
        view(0, replica_digests=digests_of([zero(0), zero(1, [sched])])),
        view(1, replica_digests=digests_of([zero(0), zero(1)])),
    ]
    judged = apply_diagnosis(snap(views), diagnose(snap(views)))
    clock = [0.0]
    polite = StopPolicy(keep_running=False, clock=lambda: clock[0])
    asked = StopPolicy(keep_running=False, clock=lambda: clock[0], stop_on_divergence=True)
    for _ in range(40):
        clock[0] += 1.0
        assert polite.observe(judged, job_running=True).stop is None
        asked.observe(judged, job_running=True)
    assert asked.stopped_for is Verdict.MISMATCH
