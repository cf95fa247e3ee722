from __future__ import annotations

from ddpdoctor.monitor.model.thresholds import HANG_FLOOR_S, STARTUP_FLOOR_S, compute_thresholds


def th(**kw):
    base = dict(
        hang_after=None,
        step_times=[0.1] * 20,
        training_waits=[0.05],
        all_waits=[0.05] * 20,
        heartbeat_period=1.0,
        training_started=True,
    )
    base.update(kw)
    return compute_thresholds(**base)


def test_fast_job_gets_the_floor():
    t = th()
    assert t.hang_after_s == HANG_FLOOR_S and t.adaptive and "floor" in t.basis


def test_before_training_the_startup_floor_covers_rank0_data_preparation():
    assert th(training_started=False).hang_after_s == STARTUP_FLOOR_S


def test_slow_steps_raise_the_threshold():
    t = th(step_times=[1.2] * 10)
    assert t.hang_after_s == 12.0 and "median step time" in t.basis


def test_a_long_normal_wait_raises_the_threshold():
    assert th(training_waits=[0.05, 6.0]).hang_after_s == 9.0


def test_hang_after_overrides_everything():
    t = th(hang_after=2.0, step_times=[3.0])
    assert t.hang_after_s == 2.0 and not t.adaptive and t.waiting_after_s == 1.0


def test_waiting_shows_after_a_few_normal_collectives_but_before_the_hang():
    assert th().waiting_after_s == 1.0
    assert th(all_waits=[2.0] * 10, step_times=[3.0]).waiting_after_s == 6.0
    assert th(all_waits=[9.0] * 10).waiting_after_s == 0.5 * HANG_FLOOR_S


def test_stale_heartbeat_scales_with_its_period():
    assert th().heartbeat_stale_s == 5.0
    assert th(heartbeat_period=2.0).heartbeat_stale_s == 10.0


def test_blocked_culprits_have_a_sooner_threshold_that_follows_the_job():
    quick = th(step_times=[0.01] * 20)
    assert quick.hang_after_s == 5.0 and quick.hang_blocked_after_s == 2.5
    assert "2.5 s when every rank behind is blocked" in quick.basis
    assert th(step_times=[0.4] * 20).hang_blocked_after_s == 4.0  # 10 x the median step
    assert th(heartbeat_period=2.0).hang_blocked_after_s == 5.0  # 2.5 heartbeat periods


def test_no_sooner_threshold_before_training_or_with_hang_after():
    for t in (th(training_started=False), th(hang_after=7.0)):
        assert t.hang_blocked_after_s == t.hang_after_s
