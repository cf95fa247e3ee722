"""The progress model: busy, blocked, waiting on the GPU, from heartbeats' CPU, I/O and frames."""

from __future__ import annotations

import pytest

from ddpdoctor.monitor.model.progress import (
    BLOCKED_INTERVALS,
    ProgressSample,
    ProgressTrack,
    activity,
    judge,
)
from ddpdoctor.protocol.verdicts import ActivityState

T0 = 1_000.0
SLEEP = ("time.py:0 sleep", "prep.py:12 wait_for_file")


def beats(cpu: list[float], frames=None, io=None, every: float = 1.0) -> list[ProgressSample]:
    """Heartbeats one `every` apart with cumulative CPU seconds `cpu`."""
    out = []
    for i, c in enumerate(cpu):
        frame, where = frames[i] if frames else SLEEP
        out.append(ProgressSample(T0 + i * every, c, io[i] if io else 1000, frame, where))
    return out


def test_cpu_advancing_on_the_same_line_is_busy():
    """A CPU-bound loop (unpacking a data set): the instruction may look the same at every beat,
    the CPU time says it works."""
    loop = ("prep.py:8 <genexpr>", "prep.py:8 <genexpr>")
    got = judge(beats([1.0, 2.0, 3.0, 3.95], frames=[loop] * 4))
    assert got is not None and got.state is ActivityState.BUSY
    assert got.cpu_pct == pytest.approx(98.3, abs=0.5)
    assert got.where == "prep.py:8 <genexpr>" and got.since_t == T0


def test_no_cpu_no_io_and_the_same_frame_across_two_intervals_is_blocked():
    got = judge(beats([1.0, 1.001, 1.002]))
    assert got is not None and got.state is ActivityState.BLOCKED
    assert got.since_t == T0 and got.cpu_pct == pytest.approx(0.1)
    assert got.where == "prep.py:12 wait_for_file" and got.frame == "time.py:0 sleep"


def test_one_idle_interval_is_not_enough_to_call_a_rank_blocked():
    assert BLOCKED_INTERVALS == 2
    assert judge(beats([1.0, 1.0])) is None
    assert judge(beats([1.0])) is None


def test_a_short_pause_after_work_is_still_busy_then_blocked_since_the_work_stopped():
    work = beats([1.0, 2.0, 3.0, 3.0])  # worked two seconds, then one idle beat
    assert judge(work).state is ActivityState.BUSY
    stopped = beats([1.0, 2.0, 3.0, 3.0, 3.0])
    got = judge(stopped)
    assert got.state is ActivityState.BLOCKED and got.since_t == T0 + 2


def test_a_moving_stack_is_progress_even_without_cpu():
    frames = [("a.py:1 f", "a.py:1 f"), ("a.py:2 g", "a.py:2 g"), ("a.py:1 f", None)]
    assert judge(beats([1.0, 1.0, 1.0], frames=frames)).state is ActivityState.BUSY


def test_bytes_flowing_is_progress_a_download_waiting_on_the_network():
    got = judge(beats([1.0, 1.01, 1.02], io=[0, 5_000_000, 9_000_000]))
    assert got.state is ActivityState.BUSY
    quiet = judge(beats([1.0, 1.01, 1.02], io=[0, 400, 800]))  # the heartbeats' own writes
    assert quiet.state is ActivityState.BLOCKED


def test_workers_cpu_makes_a_waiting_main_thread_busy_and_a_working_gpu_a_gpu_wait():
    idle = beats([1.0, 1.0, 1.0])
    assert judge(idle, child_cpu_pct=180.0).state is ActivityState.BUSY
    assert judge(idle, child_cpu_pct=3.0).state is ActivityState.BLOCKED
    got = judge(idle, gpu_util_pct=97.0)
    assert got.state is ActivityState.GPU_WAIT and got.gpu_util_pct == 97.0
    assert judge(idle, gpu_util_pct=0.0).state is ActivityState.BLOCKED


def test_track_keeps_order_skips_runtimes_without_progress_facts_and_ages_host_facts():
    track = ProgressTrack()
    for sample in beats([1.0, 1.0, 1.0]):
        track.add(sample)
    track.add(ProgressSample(T0 - 5, 9.0))  # out of order: ignored
    track.add(ProgressSample(T0 + 10, None))  # no cpu_s: an older runtime
    assert track.judge().state is ActivityState.BLOCKED
    track.set_children(T0 + 2, 150.0)
    assert track.judge().state is ActivityState.BUSY
    track.set_children(T0 - 10, 150.0)  # sampled long before the latest heartbeat: stale
    assert track.judge().state is ActivityState.BLOCKED


def test_activity_in_a_collective_and_its_age():
    judged = judge(beats([1.0, 2.0, 3.0]))
    inside = activity(judged, now=T0 + 5, in_collective=True, in_collective_since=T0 + 1)
    assert inside.state is ActivityState.IN_COLLECTIVE and inside.since_s == 4.0
    busy = activity(judged, now=T0 + 5, in_collective=False, in_collective_since=None)
    assert busy.state is ActivityState.BUSY and busy.since_s == 5.0
    assert busy.describe() == "busy in prep.py:12 wait_for_file (CPU 100%)"
    assert activity(None, now=T0, in_collective=False, in_collective_since=None) is None


def test_a_busy_rank_starved_of_cpu_on_an_overloaded_machine_is_still_busy():
    """It got 10% of a core, and waited for a CPU the rest of the time: ready to run is not
    blocked."""
    starved = [
        ProgressSample(
            T0 + i, 1.0 + 0.1 * i, 1000, "prep.py:8 unpack", "prep.py:8 unpack", 0.88 * i
        )
        for i in range(4)
    ]
    got = judge(starved)
    assert got.state is ActivityState.BUSY and got.cpu_pct == pytest.approx(10.0)
    asleep = [
        ProgressSample(T0 + i, 1.0, 1000, "a.py:1 f", "a.py:1 f", 0.001 * i) for i in range(4)
    ]
    assert judge(asleep).state is ActivityState.BLOCKED


def test_workers_doing_the_work_show_in_the_heartbeats_too_for_ranks_on_other_nodes():
    waiting_on_queue = [
        ProgressSample(T0 + i, 1.0, 1000, "queues.py:1 get", "train.py:40 main", 0.0, 3.0 * i)
        for i in range(4)
    ]
    got = judge(waiting_on_queue)
    assert got.state is ActivityState.BUSY and got.child_cpu_pct == pytest.approx(300.0)
    dead_workers = [
        ProgressSample(T0 + i, 1.0, 1000, "queues.py:1 get", "train.py:40 main", 0.0, 3.0)
        for i in range(4)
    ]
    assert judge(dead_workers).state is ActivityState.BLOCKED
