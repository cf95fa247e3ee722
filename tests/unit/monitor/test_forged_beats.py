"""Heartbeats appended to a live rank's event file by another process decide nothing (issue 40):
the runtime numbers its heartbeats, so a number read again or going back disputes the rank's
heartbeats (`run.forged_beats`). Disputed, they confirm no error line and cannot make the rank
blocked; and wherever the watcher sees the process itself, its own look at the CPU wins over
what any heartbeat says."""

from __future__ import annotations

import os
import sys
import time

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.host_probes import RecordedGpuProbe
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.model.progress import ProgressSample, ProgressTrack
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import Verdict
from ddpdoctor.monitor.pipeline.seen import contradicted_findings
from ddpdoctor.protocol.verdicts import ActivityState
from tests.procs import background
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, new_run, run_env

SPINNER = [
    sys.executable,
    "-c",
    "import time\nend = time.time() + 30\nwhile time.time() < end: pass",
]


def beat(tracker: RankTracker, seq: int, t: float, **fields) -> None:
    tracker.apply({"kind": "heartbeat", "t": t, "rank": tracker.rank, "seq": seq, **fields})


def started(rank: int = 1) -> RankTracker:
    tracker = RankTracker(rank)
    tracker.apply({"kind": "hello", "t": 0.5, "rank": rank, "pid": 42, "host": "h",
                   "beat_fields": ["open", "errors"]})  # fmt: skip
    return tracker


class _State:
    def __init__(self, trackers: list[RankTracker]) -> None:
        self.ranks = {t.rank: t for t in trackers}


def test_a_heartbeat_numbered_again_disputes_the_ranks_heartbeats():
    tracker = started()
    beat(tracker, 1, 1.0)
    beat(tracker, 3, 2.0)  # a beat may be dropped: a gap is no dispute
    assert tracker.beats_disputed is None
    beat(tracker, 3, 2.5)  # another writer's
    beat(tracker, 4, 3.0)
    assert tracker.beats_disputed == "heartbeat #3 read after #3" and tracker.progress.disputed
    (finding,) = contradicted_findings(_State([tracker]))
    assert finding.id == "run.forged_beats" and "rank 1" in finding.summary


def test_a_stream_numbered_ahead_is_disputed_when_the_own_count_comes_back():
    tracker = started()
    beat(tracker, 1, 1.0)
    beat(tracker, 1000, 1.2)  # forged far ahead
    beat(tracker, 2, 2.0)  # the runtime's own next beat
    assert tracker.beats_disputed == "heartbeat #2 read after #1000"


def test_a_new_process_or_a_new_hello_numbers_from_one_again():
    tracker = started()
    beat(tracker, 5, 1.0)
    tracker.apply({"kind": "hello", "t": 2.0, "rank": 1, "pid": 43, "host": "h"})  # restarted
    beat(tracker, 1, 3.0)
    assert tracker.beats_disputed is None and not tracker.progress.disputed


def test_an_error_confirmed_by_a_forged_beat_is_unconfirmed_again_by_the_real_one():
    tracker = started()
    beat(tracker, 1, 1.0, errors=0)
    tracker.apply({"kind": "error", "t": 1.5, "rank": 1, "exc_type": "RuntimeError",
                   "message": "forged", "fatal": True})  # fmt: skip
    assert tracker.error_unconfirmed
    beat(tracker, 2, 1.6, errors=1)  # forged: counts the forged error
    assert not tracker.error_unconfirmed
    beat(tracker, 2, 2.0, errors=0)  # the runtime's own beat #2
    assert tracker.progress.disputed and tracker.error_unconfirmed
    beat(tracker, 3, 3.0, errors=1)  # a disputed stream confirms nothing
    assert tracker.error_unconfirmed


def idle_samples() -> list[ProgressSample]:
    return [
        ProgressSample(float(t), 2.0, 10, "c10d.py:1 wait", "train.py:9 main") for t in range(5)
    ]


def test_disputed_heartbeats_cannot_make_a_rank_blocked_without_the_watchers_own_look():
    track = ProgressTrack()
    for sample in idle_samples():
        track.add(sample)
    assert track.judge().state is ActivityState.BLOCKED  # its word, undisputed
    track.disputed = True
    track._dirty = True
    assert track.judge() is None
    track.set_own(3.0, 0.5, since=2.0)
    assert track.judge() is None  # one idle look is not enough
    track.set_own(4.0, 0.0, since=3.0)
    judged = track.judge()
    assert judged.state is ActivityState.BLOCKED and judged.since_t == 2.0


def test_the_watchers_own_look_at_a_busy_process_wins_over_its_heartbeats():
    track = ProgressTrack()
    for sample in idle_samples():
        track.add(sample)
    track.set_own(4.0, 95.0, since=3.0)
    assert track.judge().state is ActivityState.BUSY
    track.set_own(5.0, 1.0, since=4.0)  # and once it idles, the heartbeats speak again
    assert track.judge().state is ActivityState.BLOCKED


def test_a_spinning_rank_whose_heartbeats_say_blocked_is_waited_for_not_a_hang(tmp_path):
    """Rank 1 waits in a barrier; rank 0's heartbeats say it has not moved (the same CPU
    seconds, the same frame), but its process spins: the watcher's own looks see it busy."""
    with background(SPINNER, env=run_env(tmp_path / "run")) as proc:
        run, clock = new_run(tmp_path), Clock(time.time())
        w = Writer(run, clock, host=this_host())
        monitor = Monitor(run, clock=clock, explain_logs=False, capture_stacks=False,
                          gpu_probe=RecordedGpuProbe({}))  # fmt: skip
        w.start(pids=[proc.pid, os.getpid()])
        since = clock.t
        w.ev(1, "collective_start", op="barrier", seq=1, group="default")
        snaps = []
        for i in range(10):
            clock.t += 1.0
            time.sleep(0.6)  # the real time a look at a process's CPU needs
            w.ev(0, "heartbeat", seq=i + 1, step=0, phase="eval", open=None, cpu_s=2.0,
                 io_bytes=10, frame="train.py:90 evaluate", where="train.py:90 evaluate")  # fmt: skip
            w.ev(1, "heartbeat", seq=i + 1, step=0, phase="train", cpu_s=2.0, io_bytes=10,
                 frame="c10d.py:1 barrier", where="train.py:70 main",
                 open={"op": "barrier", "seq": 1, "group": "default", "since_t": since})  # fmt: skip
            snaps.append(monitor.poll())
    assert all(s.verdict is not Verdict.HANG for s in snaps), [s.verdict for s in snaps]
    activity = snaps[-1].ranks[0].activity
    assert activity is not None and activity.state is ActivityState.BUSY, activity
