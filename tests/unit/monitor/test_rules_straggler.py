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
