from __future__ import annotations

import os
import shutil
import threading

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import records
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary
from ddpdoctor.runtime.records import CollectiveDesc
from ddpdoctor.runtime.writer import EventWriter


def lines_of(path):
    return path.read_bytes().decode("utf-8").splitlines()


def test_threads_never_interleave_within_a_line(tmp_path):
    path = tmp_path / "rank-0.jsonl"
    writer = EventWriter(path)
    threads_n, per_thread = 8, 300
    start = threading.Barrier(threads_n)

    def work(tid: int) -> None:
        start.wait()
        for i in range(per_thread):
            # some lines far beyond PIPE_BUF, to catch a split write
            payload = "x" * (9000 if i % 50 == 0 else i % 97)
            writer.write({"rank": 0, "kind": "metrics", "tid": tid, "i": i, "pad": payload})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()

    lines = lines_of(path)
    assert len(lines) == threads_n * per_thread
    events = [parse_event_line(line) for line in lines]
    assert all(e is not None for e in events)
    for tid in range(threads_n):  # each thread's lines are whole and in its own order
        assert [e["i"] for e in events if e["tid"] == tid] == list(range(per_thread))
    assert writer.lines_written == threads_n * per_thread


def test_full_disk_gives_one_warning_and_never_raises(capsys):
    writer = EventWriter("/dev/full")
    results = [writer.write({"rank": 0, "kind": "heartbeat", "seq": i}) for i in range(5)]
    assert results == [False] * 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("ddpdoctor: warning: cannot write events to /dev/full")
    assert "No space left on device" in err[0]
    assert not writer.healthy


def test_removed_run_directory_before_the_first_write(tmp_path, capsys):
    events = tmp_path / "run" / "events"
    events.mkdir(parents=True)
    writer = EventWriter(events / "rank-3.jsonl")
    shutil.rmtree(tmp_path / "run")
    assert writer.write({"rank": 3, "kind": "hello"}) is False
    assert writer.write({"rank": 3, "kind": "heartbeat"}) is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "No such file or directory" in err[0]


def test_removed_run_directory_while_writing(tmp_path, capsys):
    events = tmp_path / "run" / "events"
    events.mkdir(parents=True)
    writer = EventWriter(events / "rank-0.jsonl")
    assert writer.write({"rank": 0, "kind": "hello"}) is True
    shutil.rmtree(tmp_path / "run")
    # the open descriptor still accepts writes; the heartbeat's check notices the missing name
    writer.check_file()
    writer.check_file()
    assert writer.write({"rank": 0, "kind": "heartbeat"}) is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "was removed" in err[0]
    assert not (tmp_path / "run").exists()  # nothing recreated behind the user's back


def test_retries_after_a_failure_without_warning_again(tmp_path, capsys):
    now = [0.0]
    events = tmp_path / "events"
    writer = EventWriter(events / "rank-0.jsonl", clock=lambda: now[0])
    assert writer.write({"rank": 0, "kind": "hello"}) is False  # folder missing
    events.mkdir()
    assert writer.write({"rank": 0, "kind": "heartbeat"}) is False  # still backing off
    now[0] += 60
    assert writer.write({"rank": 0, "kind": "heartbeat"}) is True
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert [parse_event_line(x)["kind"] for x in lines_of(events / "rank-0.jsonl")] == ["heartbeat"]


def test_odd_values_are_written_as_text(tmp_path):
    writer = EventWriter(tmp_path / "r.jsonl")
    writer.write({"rank": 0, "kind": "metrics", "obj": object(), "text": "a\nb\u2028c\x85d"})
    (line,) = lines_of(tmp_path / "r.jsonl")
    event = parse_event_line(line)
    assert event["text"] == "a\nb\u2028c\x85d"
    assert event["obj"].startswith("<object object")


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc")
def test_close_releases_the_descriptor(tmp_path):
    writer = EventWriter(tmp_path / "r.jsonl")
    writer.write({"rank": 0, "kind": "hello"})
    before = len(os.listdir("/proc/self/fd"))
    writer.close()
    assert len(os.listdir("/proc/self/fd")) == before - 1
    assert writer.write({"rank": 0, "kind": "hello"}) is False


def test_queued_events_keep_their_order_behind_a_direct_write(tmp_path):
    path = tmp_path / "r.jsonl"
    writer = EventWriter(path)
    nudges = []
    writer.on_first_queued = lambda: nudges.append(1)
    writer.enqueue({"rank": 0, "kind": "collective_start", "seq": 1})
    writer.enqueue({"rank": 0, "kind": "collective_end", "seq": 1})
    assert not path.exists() and writer.pending == 2
    assert nudges == [1]  # only the first event into an empty queue wakes the flusher
    writer.write({"rank": 0, "kind": "fault", "fault": "exit"})  # must be on disk at once
    assert [parse_event_line(x)["kind"] for x in lines_of(path)] == [
        "collective_start",
        "collective_end",
        "fault",
    ]
    writer.enqueue({"rank": 0, "kind": "step", "step": 1})
    writer.close()  # drains, then refuses
    writer.enqueue({"rank": 0, "kind": "step", "step": 2})
    assert writer.flush() is True and writer.pending == 0
    assert [parse_event_line(x)["kind"] for x in lines_of(path)][-1] == "step"
    assert len(lines_of(path)) == 4


def test_hot_path_records_are_encoded_with_the_writers_rank_in_order(tmp_path):
    path = tmp_path / "rank-3.jsonl"
    writer = EventWriter(path, rank=3)
    desc = CollectiveDesc(
        "all_reduce",
        GroupInfo("gr\u2028oup", 2),
        TensorSummary(((2, 3),), ("bfloat16",), 6),
        is_async=True,
        bucket=1,
    )
    writer.enqueue((records.collective_start, 100.5, 7.25, desc, 4, None, 0))
    writer.enqueue({"rank": 3, "kind": "metrics", "loss": 0.5})
    writer.write((records.collective_end, 100.75, 7.5, desc, 4, 0.25, 'Err: "x"\n', "future"))
    lines = lines_of(path)
    assert len(lines) == 3  # the odd character in the group name does not split a line
    start, metrics, end = (parse_event_line(line) for line in lines)
    assert start == {
        "v": 1, "t": 100.5, "mono": 7.25, "rank": 3, "kind": "collective_start",
        "op": "all_reduce", "seq": 4, "group": "gr\u2028oup", "group_size": 2,
        "group_ranks": None, "shapes": [[2, 3]], "dtypes": ["bfloat16"], "numel": 6,
        "async": True, "bucket": 1,
    }  # fmt: skip
    assert metrics["kind"] == "metrics"
    assert end == {
        "v": 1, "t": 100.75, "mono": 7.5, "rank": 3, "kind": "collective_end",
        "op": "all_reduce", "seq": 4, "group": "gr\u2028oup", "duration_s": 0.25,
        "ok": False, "error": 'Err: "x"\n', "via": "future",
    }  # fmt: skip


def test_the_last_event_stays_last_while_another_thread_still_writes(tmp_path):
    """The exit event and the closing of the file are one step: a heartbeat that was on its way
    (its thread had not seen the rank finish) lands before it or not at all. Written and then
    closed in two steps, a heartbeat once landed in between, after the exit event."""
    path = tmp_path / "rank-1.jsonl"
    w = EventWriter(path, rank=1)
    w.enqueue({"rank": 1, "kind": "step", "step": 3})
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            w.write({"rank": 1, "kind": "heartbeat"})

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        assert w.write_last({"rank": 1, "kind": "exit", "code": 1})
        assert not w.write({"rank": 1, "kind": "heartbeat"})  # refused after it
    finally:
        stop.set()
        thread.join(10)
    kinds = [parse_event_line(line)["kind"] for line in path.read_bytes().splitlines()]
    assert kinds[-1] == "exit" and "step" in kinds
    assert w._fd is None  # the file closed with it


def _step_record(number: int) -> tuple:
    return (records.step, 1000.0, 5.0, number, 0, 0.5, 16, 1, 0.02, 0.001, 0.0)


def test_a_slow_steps_lean_write_keeps_order_and_reports_a_failure_once(tmp_path, capsys):
    """write_record (a slow step as it closes): on disk when it returns, after whatever was
    queued, and a failing file warns once and never raises, as write() does."""
    path = tmp_path / "rank-3.jsonl"
    writer = EventWriter(path, rank=3)
    assert writer.write({"v": 1, "rank": 3, "kind": "hello"})  # the file is open
    assert writer.write_record(_step_record(1))  # the lean path: nothing queued
    writer.enqueue({"v": 1, "rank": 3, "kind": "phase", "phase": "train"})
    assert writer.write_record(_step_record(2))  # the queue goes first
    events = [parse_event_line(line.encode()) for line in lines_of(path)]
    assert [(e["kind"], e.get("step")) for e in events] == [
        ("hello", None),
        ("step", 1),
        ("phase", None),
        ("step", 2),
    ]
    assert events[1] == records.as_event(_step_record(1), 3)
    assert writer.lines_written == 4
    fd = writer._fd
    os.close(fd)  # the descriptor goes bad under the writer (a file system that went away)
    writer._fd = os.open(os.devnull, os.O_RDONLY)  # a write on it fails: EBADF
    assert writer.write_record(_step_record(3)) is False
    assert writer.write_record(_step_record(4)) is False  # retried later, not now
    err = capsys.readouterr().err
    assert err.count("ddpdoctor: warning: cannot write events") == 1
