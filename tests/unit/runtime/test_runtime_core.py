"""The Runtime's envelope, the rank learned late, steps as the hooks report them."""

from __future__ import annotations

import pytest

from ddpdoctor.protocol.events import SCHEMA_VERSION, parse_event_line
from ddpdoctor.runtime import records
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary
from ddpdoctor.runtime.core import Runtime
from ddpdoctor.runtime.steps import StepTracker


def read(runtime, rank):
    runtime.flush()
    path = runtime.run_dir.events_file(rank)
    return [e for e in map(parse_event_line, path.read_bytes().split(b"\n")) if e]


@pytest.fixture
def run_path(tmp_path):
    path = tmp_path / "run"
    (path / "events").mkdir(parents=True)
    return path


def test_envelope(run_path):
    runtime = Runtime(run_path, rank=4, wall_clock=lambda: 1000.5, mono_clock=lambda: 7.25)
    runtime.emit("phase", phase="train")
    (event,) = read(runtime, 4)
    assert event == {
        "v": SCHEMA_VERSION,
        "t": 1000.5,
        "mono": 7.25,
        "rank": 4,
        "kind": "phase",
        "phase": "train",
    }


def test_events_wait_for_a_rank_learned_late(run_path):
    runtime = Runtime(run_path, rank=None)
    runtime.emit("hello", pid=1)
    runtime.emit("heartbeat", seq=1)
    assert list((run_path / "events").iterdir()) == []
    runtime.set_rank(5)  # init_process_group told us
    runtime.emit("phase", phase="train")
    assert [(e["kind"], e["rank"]) for e in read(runtime, 5)] == [
        ("hello", 5),
        ("heartbeat", 5),
        ("phase", 5),
    ]


def test_hot_path_records_wait_for_the_rank_too(run_path):
    runtime = Runtime(run_path, rank=None)
    rec = runtime.collectives.start(
        "barrier", GroupInfo("default", 2), TensorSummary(), is_async=False
    )  # before init_process_group returns: kept in memory with the dict events
    runtime.emit("phase", phase="train")
    runtime.collectives.end(rec)
    runtime.set_rank(1)
    assert [(e["kind"], e["rank"]) for e in read(runtime, 1)] == [
        ("collective_start", 1),
        ("phase", 1),
        ("collective_end", 1),
    ]


def test_immediate_records_reach_the_file_behind_everything_queued(run_path):
    runtime = Runtime(run_path, rank=0)
    group = GroupInfo("default", 2)
    bucket = runtime.collectives.start(
        "all_reduce", group, TensorSummary(((8,),), ("float32",), 8), is_async=True, bucket=0
    )
    runtime.emit("metrics", loss=0.5)
    runtime.collectives.end(bucket)
    path = runtime.run_dir.events_file(0)
    assert not path.exists()  # queued for the heartbeat thread
    runtime.collectives.start("barrier", group, TensorSummary(), is_async=False)
    on_disk = [parse_event_line(line) for line in path.read_bytes().splitlines()]
    assert [(e["kind"], e.get("op")) for e in on_disk] == [
        ("collective_start", "all_reduce"),
        ("metrics", None),
        ("collective_end", "all_reduce"),
        ("collective_start", "barrier"),
    ]
    assert on_disk[0]["bucket"] == 0 and on_disk[0]["shapes"] == [[8]]


def test_a_phase_named_by_the_script_turns_the_automatic_ones_off(run_path):
    runtime = Runtime(run_path, rank=0)
    assert runtime.auto_phase and runtime.phase == "init"
    runtime.set_phase("train", auto=True)
    assert runtime.auto_phase
    runtime.set_phase("validate")
    assert not runtime.auto_phase
    assert [(e["phase"], e["previous"]) for e in read(runtime, 0)] == [
        ("train", "init"),
        ("validate", "train"),
    ]


def test_a_rank_never_learned_writes_as_rank_zero_at_exit(run_path):
    runtime = Runtime(run_path, rank=None)
    runtime.emit("hello", pid=1)
    runtime.finish(0, "normal")
    assert [e["kind"] for e in read(runtime, 0)] == ["hello", "exit"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_step_timings_split_the_wall_time():
    emitted = []
    clock = Clock()
    steps = StepTracker(lambda record: emitted.append(records.as_event(record)), clock)
    # iteration 1: fetch 0.0-0.2, forward at 0.2, bucket launched 0.5, done 0.6, blocking
    # collective 0.05; iteration 2 starts with the next fetch at 1.0
    steps.on_fetch(0.0, 0.2, exhausted=False, epoch=3)
    steps.on_forward(0.2, grad=True, synced=True, batch_size=16)
    token = steps.on_bucket_launch(0.5)
    steps.on_bucket_done(token, 0.6)
    steps.on_comm_wait(0.05)
    steps.on_loss(0.75)
    steps.on_fetch(1.0, 1.1, exhausted=False, epoch=3)
    (first,) = emitted
    assert first["step"] == 1 and first["epoch"] == 3 and first["loss"] == 0.75
    assert first["step_time_s"] == 1.0
    assert first["data_time_s"] == 0.2
    assert first["comm_wait_s"] == pytest.approx(0.15)
    assert first["compute_time_s"] == pytest.approx(0.65)
    assert first["samples_per_s"] == 16.0
    clock.now = 2.0
    steps.flush()  # the open iteration has no forward yet: nothing to close
    assert len(emitted) == 1
    steps.on_forward(1.1, grad=True, synced=True, batch_size=16)
    steps.flush()
    assert [e["step"] for e in emitted] == [1, 2]
    assert emitted[1]["step_time_s"] == 1.0  # 1.0 -> 2.0 (the flush)


def test_loader_end_closes_the_last_step_of_an_epoch():
    emitted = []
    steps = StepTracker(lambda record: emitted.append(records.as_event(record)), Clock())
    steps.on_fetch(0.0, 0.1, exhausted=False, epoch=0)
    steps.on_forward(0.1, grad=True, synced=True, batch_size=2)
    steps.on_fetch(0.5, 0.5, exhausted=True, epoch=None)
    assert [e["step_time_s"] for e in emitted] == [0.5]
    assert steps.current == 1


def test_a_step_record_reads_back_as_the_step_event():
    record = (records.step, 1000.5, 7.25, 3, None, float("nan"), 0, 2, 0.5, 0.75, 0.125)
    event = records.as_event(record, rank=2)
    assert event == {
        "v": SCHEMA_VERSION,
        "t": 1000.5,
        "mono": 7.25,
        "rank": 2,
        "kind": "step",
        "step": 3,
        "epoch": None,
        "loss": "nan",  # as api.log writes a non-finite value
        "batch_size": None,  # no tensor argument: unknown
        "forwards": 2,
        "step_time_s": 0.5,
        "data_time_s": 0.5,  # capped at the step's time
        "compute_time_s": 0.0,
        "comm_wait_s": 0.125,
        "samples_per_s": None,
    }


def test_a_slow_step_is_on_disk_when_it_closes_and_fast_ones_wait_for_the_flush(run_path):
    """What a SIGKILL right after a step leaves: the events file as it is, no flush."""
    from ddpdoctor.runtime import core

    now = [100.0]
    runtime = Runtime(run_path, rank=0, mono_clock=lambda: now[0])
    path = runtime.run_dir.events_file(0)

    def on_disk() -> list[int]:
        events = map(parse_event_line, path.read_bytes().split(b"\n")) if path.exists() else []
        return [e["step"] for e in events if e and e["kind"] == "step"]

    closed = [0]

    def close_step(after_s: float) -> None:
        now[0] += after_s
        closed[0] += 1
        record = (records.step, 1000.0, now[0], closed[0], None, None, 16, 1, after_s, 0.0, 0.0)
        runtime.steps.sink(record)

    close_step(1.0)  # the first: written
    close_step(core.SLOW_STEP_S * 2)  # slow: written
    assert on_disk() == [1, 2]
    for _ in range(3):
        close_step(0.001)  # millisecond steps: queued
    assert on_disk() == [1, 2]
    close_step(core.STEP_WRITE_EVERY_S)  # the last write is old: written, after the queue
    assert on_disk() == [1, 2, 3, 4, 5, 6]


def test_the_launcher_hears_the_rank_however_it_was_learned_but_never_a_guess(
    run_path, monkeypatch
):
    """torchrun's RANK (the bootstrap's Runtime(rank=...)) and a rank learned late (set_rank)
    are said to the launcher's socket; a rank never learned, filed under 0 at exit, is not."""
    import os

    from ddpdoctor.protocol.rank_socket import ENV_RANK_SOCKET, RankSocket

    sock = RankSocket.open()
    assert sock is not None
    monkeypatch.setenv(ENV_RANK_SOCKET, str(sock.path))
    try:
        Runtime(run_path, rank=3)
        assert sock.rank_of(os.getpid()) == 3
        Runtime(run_path, rank=None).set_rank(5)
        assert sock.rank_of(os.getpid()) == 5
        guessed = Runtime(run_path, rank=None)
        guessed.finish(1, "exception")  # never learned its rank: rank 0's file, no word
        assert (run_path / "events" / "rank-0.jsonl").exists()
        assert sock.rank_of(os.getpid()) == 5
    finally:
        sock.close()
