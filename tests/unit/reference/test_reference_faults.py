"""Fault injection in the reference job, observed through fake hooks (nothing really hangs)."""

from __future__ import annotations

import pytest

from ddpdoctor.reference.faults import (
    EXIT_FAULT_CODE,
    FaultHooks,
    FaultInjector,
    InjectedCrash,
    _inject_hang,
)
from ddpdoctor.reference.inject import parse_inject


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def hooks(self) -> FaultHooks:
        return FaultHooks(
            record=lambda text, kind, step: self.calls.append(("record", text, kind, step)),
            extra_collective=lambda: self.calls.append(("extra_collective",)),
            sleep=lambda seconds: self.calls.append(("sleep", seconds)),
            hang=lambda: self.calls.append(("hang",)),
            hard_exit=lambda code: self.calls.append(("exit", code)),
            announce=lambda text: self.calls.append(("announce", text)),
        )


def injector(*specs: str, rank: int) -> tuple[FaultInjector, Recorder]:
    recorder = Recorder()
    return FaultInjector([parse_inject(s) for s in specs], rank, recorder.hooks()), recorder


def kinds(recorder: Recorder) -> list[str]:
    return [c[0] for c in recorder.calls if c[0] != "announce"]


def test_hang_is_recorded_then_blocks_on_its_rank_at_its_step():
    inj, rec = injector("hang:rank=1,step=3", rank=1)
    inj.before_step(1)
    inj.before_step(2)
    assert rec.calls == []
    inj.before_step(3)
    assert kinds(rec) == ["record", "hang"]
    assert rec.calls[0] == ("record", "hang:rank=1,step=3", "hang", 3)
    announce = next(c[1] for c in rec.calls if c[0] == "announce")
    assert "rank 1 step 3: injected hang" in announce


def test_other_ranks_are_untouched():
    inj, rec = injector("hang:rank=1,step=3", "crash:rank=1,step=2", rank=0)
    for step in range(1, 10):
        inj.before_step(step)
    assert rec.calls == [] and not inj.active


def test_crash_raises_after_recording():
    inj, rec = injector("crash:rank=0,step=2", rank=0)
    inj.before_step(1)
    with pytest.raises(InjectedCrash, match="injected crash on rank 0 at step 2"):
        inj.before_step(2)
    assert kinds(rec) == ["record"]


def test_exit_records_then_exits_hard():
    inj, rec = injector("exit:rank=0,step=1", rank=0)
    inj.before_step(1)
    assert kinds(rec) == ["record", "exit"]
    assert rec.calls[-1] == ("exit", EXIT_FAULT_CODE)


def test_slow_sleeps_every_step_from_its_step_and_records_once():
    inj, rec = injector("slow:rank=0,step=2,seconds=0.25", rank=0)
    for step in range(1, 5):
        inj.before_step(step)
    assert kinds(rec) == ["record", "sleep", "sleep", "sleep"]
    assert rec.calls[0] == ("record", "slow:rank=0,step=2,seconds=0.25", "slow", 2)
    assert {c[1] for c in rec.calls if c[0] == "sleep"} == {0.25}


def test_mismatch_calls_an_extra_collective():
    inj, rec = injector("mismatch:rank=1,step=4", rank=1)
    inj.before_step(4)
    assert kinds(rec) == ["record", "extra_collective"]


def test_shape_grows_the_culprits_metric_all_reduce_only():
    culprit, rec = injector("shape:rank=1,step=3", rank=1)
    peer, peer_rec = injector("shape:rank=1,step=3", rank=0)
    # Every rank knows to join the metric all_reduce at step 3.
    assert culprit.sync_steps() == peer.sync_steps() == frozenset({3})
    culprit.before_step(3)  # shape does not fire before the step
    assert rec.calls == []
    assert culprit.sync_size(2, 4) == 4
    assert culprit.sync_size(3, 4) == 5
    assert peer.sync_size(3, 4) == 4
    assert kinds(rec) == ["record"] and peer_rec.calls == []


def test_hang_loop_really_does_not_return():
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 3:
            raise TimeoutError

    with pytest.raises(TimeoutError):
        _inject_hang(sleep)
    assert len(calls) == 3
