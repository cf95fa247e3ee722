from __future__ import annotations

from ddpdoctor.monitor.judge.rules import straggler
from ddpdoctor.monitor.model.snapshot import RankState
from tests.unit.monitor.test_monitor_builders import snap, view


def work(rank, data, compute, comm, steps=10, state=RankState.RUNNING, **kw):
    return view(
        rank,
        state,
        avg_data_time_s=data,
        avg_compute_time_s=compute,
        avg_comm_wait_s=comm,
        avg_steps=steps,
        step_time_s=0.7,
        **kw,
    )


def test_rank_with_slow_data_that_the_others_wait_for():
    ranks = [work(0, 0.01, 0.1, 0.5), work(1, 0.51, 0.1, 0.01), work(2, 0.01, 0.1, 0.49)]
    out = straggler.detect(snap(ranks))
    finding = out.findings[0]
    assert finding.id == "straggler" and finding.ranks == (1,)
    assert "mostly data loading" in finding.summary and "num_workers" in finding.fix


def test_rank_with_slow_compute():
    ranks = [work(0, 0.01, 0.1, 0.3), work(1, 0.01, 0.4, 0.01)]
    finding = straggler.detect(snap(ranks)).findings[0]
    assert "mostly compute" in finding.summary and finding.ranks == (1,)


def test_uniformly_slow_job_has_no_straggler():
    ranks = [work(0, 0.3, 0.5, 0.01), work(1, 0.3, 0.5, 0.01)]
    assert straggler.detect(snap(ranks)) is None


def test_others_not_waiting_means_no_straggler():
    ranks = [work(0, 0.01, 0.1, 0.0), work(1, 0.01, 0.4, 0.0)]
    assert straggler.detect(snap(ranks)) is None


def test_tiny_differences_are_noise():
    ranks = [work(0, 0.001, 0.01, 0.02), work(1, 0.001, 0.03, 0.001)]
    assert straggler.detect(snap(ranks)) is None


def test_needs_enough_steps():
    ranks = [work(0, 0.01, 0.1, 0.5, steps=2), work(1, 0.5, 0.1, 0.0, steps=2)]
    assert straggler.detect(snap(ranks)) is None


def test_still_reported_when_the_job_has_finished():
    ranks = [
        work(0, 0.0, 0.002, 0.11, state=RankState.DONE),
        work(1, 0.0, 0.10, 0.01, state=RankState.DONE),
    ]
    assert straggler.detect(snap(ranks)).findings[0].ranks == (1,)


def test_one_long_step_of_rank_0_evaluating_does_not_make_it_a_straggler():
    """Rank 0 evaluates for 8 s inside one step (between epochs) while rank 1 waits: a wait, not
    a straggler; the typical step (a median) is what tells a straggler."""
    from ddpdoctor.monitor.model.rank_tracker import RankTracker

    tracker = RankTracker(0)
    for step in range(1, 11):
        compute = 8.0 if step == 5 else 0.002
        tracker.apply(
            {"kind": "step", "t": float(step), "step": step, "data_time_s": 0.0,
             "compute_time_s": compute, "comm_wait_s": 0.003}
        )  # fmt: skip
    data, compute, _comm, n = tracker.own_work_means()
    assert n == 10 and data == 0.0 and compute == 0.002


def test_a_host_with_more_runnable_threads_than_cores_makes_no_straggler():
    """4 ranks on 2 busy cores: every main thread waits for a CPU about half its time, and the
    scheduler gave rank 0 more of that wait in this window (131 against 80 ms of own work, as
    measured with two CPU hogs). Without the wait, rank 0's work is the others'."""
    ranks = [
        work(0, 0.0, 0.131, 0.01, runq_share=0.5),
        *(work(r, 0.0, 0.080, 0.06, runq_share=0.3) for r in (1, 2, 3)),
    ]
    assert straggler.detect(snap(ranks)) is None


def test_a_rank_that_alone_waits_for_a_cpu_is_still_a_straggler():
    """Another process takes rank 1's cores: only rank 1 queues for a CPU, the others wait for
    it in the all-reduce. That is a straggler, whatever the cause."""
    ranks = [
        work(0, 0.0, 0.08, 0.07, runq_share=0.01),
        work(1, 0.0, 0.15, 0.0, runq_share=0.45),
        work(2, 0.0, 0.08, 0.07, runq_share=0.0),
    ]
    finding = straggler.detect(snap(ranks)).findings[0]
    assert finding.ranks == (1,) and "mostly waiting for a CPU" in finding.summary
    assert "waited for a CPU 68 ms a step (ready to run 45% of the time" in str(finding.evidence)
    assert "Another process" in finding.fix and "num_workers" not in finding.fix


def test_a_rank_slow_besides_its_wait_for_a_cpu_is_named_for_its_own_work():
    """Rank 1 alone queues for a CPU, but even without that wait it computes twice as long:
    the fix is its compute's, not the host's."""
    ranks = [
        work(0, 0.0, 0.08, 0.2, runq_share=0.01),
        work(1, 0.0, 0.30, 0.0, runq_share=0.2),
        work(2, 0.0, 0.08, 0.2, runq_share=0.0),
    ]
    finding = straggler.detect(snap(ranks)).findings[0]
    assert finding.ranks == (1,) and "mostly compute" in finding.summary


def test_shared_cpu_wait_does_not_hide_a_rank_that_computes_much_more():
    """Every rank queues for a CPU, but rank 2 does three times the work besides: still a
    straggler."""
    ranks = [
        work(0, 0.0, 0.10, 0.25, runq_share=0.3),
        work(1, 0.0, 0.10, 0.25, runq_share=0.3),
        work(2, 0.0, 0.34, 0.01, runq_share=0.3),
    ]
    assert straggler.detect(snap(ranks)).findings[0].ranks == (2,)


def test_the_run_queue_share_comes_from_the_heartbeats():
    from ddpdoctor.monitor.model.progress import ProgressSample, ProgressTrack

    track = ProgressTrack()
    for t in range(6):  # importing torch on a busy host: queued 60 % of the time
        track.add(ProgressSample(float(t), cpu_s=0.3 * t, runq_s=0.6 * t))
    for t in range(6, 10):  # then training: 25 %
        track.add(ProgressSample(float(t), cpu_s=0.5 * t, runq_s=3.0 + 0.25 * (t - 5)))
    assert track.runq_share() == 0.25  # the recent intervals, not the start
    track.disputed = True  # a stream that is not all its process's says nothing of its queue
    assert track.runq_share() is None


def test_pipeline_stages_are_compared_only_with_their_own_stage():
    """Stage 0 embeds and stage 1 computes the loss: their work differs by design. Two replicas
    of each stage; stage 1's rank 3 is slower than its replica rank 1."""
    from ddpdoctor.monitor.model.pipeline_view import PipelineView

    def stage(rank, s, compute, comm):
        return work(rank, 0.0, compute, comm, pipeline=PipelineView(stages=(s,)))

    balanced = [stage(0, 0, 0.10, 0.30), stage(2, 0, 0.10, 0.30),
                stage(1, 1, 0.40, 0.01), stage(3, 1, 0.40, 0.01)]  # fmt: skip
    assert straggler.detect(snap(balanced)) is None
    slow = [stage(0, 0, 0.10, 0.35), stage(2, 0, 0.10, 0.35),
            stage(1, 1, 0.40, 0.25), stage(3, 1, 0.70, 0.01)]  # fmt: skip
    assert straggler.detect(snap(slow)).findings[0].ranks == (3,)


def test_a_rank_that_sends_and_receives_without_a_known_stage_is_compared_with_nobody():
    """A hand-written send/recv exchange: the rank's tracker saw a point-to-point call (which
    its latest collectives never hold), so its work is compared with nobody's."""
    from ddpdoctor.monitor.model.rank_tracker import RankTracker

    tracker = RankTracker(0)
    tracker.apply(
        {"kind": "collective_start", "t": 1.0, "op": "recv", "seq": 1, "group": "default",
         "p2p": True, "peer": 1, "shapes": [[8, 64]], "dtypes": ["float32"]}
    )  # fmt: skip
    assert tracker.sends_p2p and not tracker.recent
    ranks = [work(0, 0.0, 0.40, 0.01, sends_p2p=True), work(1, 0.0, 0.25, 0.2)]
    assert straggler.detect(snap(ranks)) is None
    ranks = [work(0, 0.0, 0.40, 0.01), work(1, 0.0, 0.25, 0.2)]  # the same work, no send/recv
    assert straggler.detect(snap(ranks)) is not None
