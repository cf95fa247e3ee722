from __future__ import annotations

import threading
import time

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary
from ddpdoctor.runtime.core import Runtime
from ddpdoctor.runtime.heartbeat import Heartbeat, rss_bytes
from ddpdoctor.runtime.progress_probe import is_user_file

PERIOD = 0.02


def heartbeats(runtime: Runtime) -> list[dict]:
    path = runtime.run_dir.events_file(0)
    if not path.exists():
        return []
    events = [parse_event_line(line) for line in path.read_bytes().split(b"\n")]
    return [e for e in events if e and e["kind"] == "heartbeat"]


@pytest.fixture
def beating(tmp_path):
    runtime = Runtime(tmp_path / "run", rank=0)
    runtime.run_dir.events_dir.mkdir(parents=True)
    heartbeat = Heartbeat(runtime, period_s=PERIOD, gpu_memory=lambda rt: None)
    heartbeat.start()
    yield runtime
    heartbeat.stop()


def wait_for_beats(runtime: Runtime, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(heartbeats(runtime)) < count:
        assert time.monotonic() < deadline, "no heartbeat"
        time.sleep(0.01)


# Each test holds the main thread in one state until three more beats came, bounded far
# above the ~60 ms three beats take: a loaded machine delays the beating thread, a stopped one
# never beats, and only the latter fails.
BOUND_S = 5.0


def test_keeps_beating_while_the_main_thread_sleeps(beating):
    wait_for_beats(beating, 1)
    before = len(heartbeats(beating))
    end = time.monotonic() + BOUND_S
    while len(heartbeats(beating)) - before < 3 and time.monotonic() < end:
        time.sleep(0.05)  # the main thread does nothing between looks
    assert len(heartbeats(beating)) - before >= 3


def test_keeps_beating_while_the_main_thread_waits_on_a_lock(beating):
    wait_for_beats(beating, 1)
    before = len(heartbeats(beating))
    lock = threading.Lock()
    lock.acquire()

    def release_after_three_beats() -> None:
        end = time.monotonic() + BOUND_S
        while len(heartbeats(beating)) - before < 3 and time.monotonic() < end:
            time.sleep(0.01)
        lock.release()

    threading.Thread(target=release_after_three_beats, daemon=True).start()
    lock.acquire()  # blocks the main thread until the watcher releases it
    assert len(heartbeats(beating)) - before >= 3


def test_keeps_beating_while_the_main_thread_spins_in_python(beating):
    wait_for_beats(beating, 1)
    before = len(heartbeats(beating))
    end = time.monotonic() + BOUND_S
    n = 0
    while time.monotonic() < end:  # holds the GIL between switch intervals
        n += 1
        if n % 20000 == 0 and len(heartbeats(beating)) - before >= 3:
            break
    assert len(heartbeats(beating)) - before >= 3


def test_reports_the_open_collective_and_counters(beating):
    rec = beating.collectives.start(
        "barrier", GroupInfo("default", 2, None), TensorSummary(), is_async=False
    )
    beating.phase = "train"
    beating.steps.steps_done = 7
    wait_for_beats(beating, len(heartbeats(beating)) + 2)
    beat = heartbeats(beating)[-1]
    assert beat["open"]["op"] == "barrier"
    assert beat["open"]["seq"] == 1
    assert beat["open"]["group"] == "default"
    assert beat["open"]["since_mono"] == pytest.approx(rec.start_mono)
    assert beat["open"]["since_t"] <= beat["t"]
    assert (beat["step"], beat["phase"]) == (7, "train")
    assert (beat["collectives_started"], beat["collectives_done"]) == (1, 0)
    assert beat["rss_bytes"] > 10 * 2**20
    assert beat["gpu_mem_bytes"] is None
    seqs = [b["seq"] for b in heartbeats(beating)]
    assert seqs == list(range(1, len(seqs) + 1))
    beating.collectives.end(rec)
    wait_for_beats(beating, len(heartbeats(beating)) + 2)
    assert heartbeats(beating)[-1]["open"] is None


def test_polls_probes_of_collectives_in_flight(beating):
    done = threading.Event()
    rec = beating.collectives.start(
        "all_reduce", GroupInfo(), TensorSummary(((4,),), ("float32",), 4, True), is_async=True
    )
    beating.collectives.watch(rec, done.is_set, "cuda_event")
    time.sleep(0.1)
    assert not rec.done
    done.set()
    deadline = time.monotonic() + 5
    while not rec.done:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not beating.collectives.polling


def test_stops_after_the_exit_event(beating):
    beating.finish(0, "normal")
    time.sleep(3 * PERIOD)
    count = len(heartbeats(beating))
    time.sleep(4 * PERIOD)
    assert len(heartbeats(beating)) == count


def test_rss_is_cheap_and_plausible():
    start = time.perf_counter()
    for _ in range(100):
        value = rss_bytes()
    assert (time.perf_counter() - start) / 100 < 0.005
    assert value is not None and value > 10 * 2**20


def test_queued_events_are_written_long_before_the_next_beat(tmp_path):
    runtime = Runtime(tmp_path / "run", rank=0)
    runtime.run_dir.events_dir.mkdir(parents=True)
    heartbeat = Heartbeat(runtime, period_s=30.0, gpu_memory=lambda rt: None)
    heartbeat.start()
    try:
        wait_for_beats(runtime, 1)  # the first beat; the next one is 30 s away
        start = time.monotonic()
        runtime.emit("collective_start", op="barrier", seq=1)  # queued: the hot path appends
        path = runtime.run_dir.events_file(0)
        while b'"collective_start"' not in path.read_bytes():
            assert time.monotonic() - start < 5, "queued event never written"
            time.sleep(0.005)
    finally:
        heartbeat.stop()


def test_a_steady_stream_is_written_without_waking_the_thread_for_each_burst(beating):
    path = beating.run_dir.events_file(0)
    writer = beating.writer

    def written():
        return path.read_bytes().count(b'"metrics"') if path.exists() else 0

    deadline = time.monotonic() + 10
    sent = 0
    woken_while_flowing = []
    while written() < 3 or writer.on_first_queued is not None:  # until it flushes on a timer
        assert time.monotonic() < deadline, "never switched to timed flushes"
        beating.emit("metrics", i=sent)
        sent += 1
        time.sleep(0.002)
    # The stream goes on: the training thread wakes no one for 20 events in a row. A loaded
    # machine can pause this thread past the heartbeat's look (a quiet spell, rightly re-armed),
    # so a window that saw a wake-up starts over, within the deadline; one that wakes on every
    # burst never gets through.
    deadline = time.monotonic() + 10
    while len(woken_while_flowing) < 20:
        assert time.monotonic() < deadline, f"woken while the stream flowed: {sent} sent"
        if writer.on_first_queued is not None:
            woken_while_flowing.clear()
        else:
            woken_while_flowing.append(None)
        beating.emit("metrics", i=sent)
        sent += 1
        time.sleep(0.002)
    deadline = time.monotonic() + 10
    while written() < sent or writer.on_first_queued is None:  # quiet: all out, re-armed
        assert time.monotonic() < deadline, "the last events were not written"
        time.sleep(0.01)
    beating.emit("metrics", i=sent)  # a lone event after a quiet spell still goes out soon
    deadline = time.monotonic() + 10
    while written() < sent + 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _sleep_in_user_code(seconds: float) -> None:
    event = threading.Event()
    event.wait(seconds)  # threading.py (the standard library) is not the user's line


def test_progress_facts_name_the_users_line_and_the_innermost_frame(beating):
    wait_for_beats(beating, 1)
    start = len(heartbeats(beating))
    _sleep_in_user_code(0.3)
    beat = heartbeats(beating)[start + 2]
    assert beat["where"].startswith("test_runtime_heartbeat.py:")
    assert beat["where"].endswith(" _sleep_in_user_code")
    assert beat["frame"].startswith("threading.py:")  # innermost: Event.wait -> Condition.wait
    assert isinstance(beat["cpu_s"], float) and isinstance(beat["io_bytes"], int)


def test_cpu_seconds_advance_while_the_main_thread_works_and_not_while_it_sleeps(beating):
    wait_for_beats(beating, 1)
    first = len(heartbeats(beating))
    time.sleep(0.3)
    slept = heartbeats(beating)[first:]
    before = heartbeats(beating)[-1]
    start = time.process_time()
    deadline = time.monotonic() + 20  # on a loaded machine the CPU comes slowly
    while time.process_time() - start < 0.2 and time.monotonic() < deadline:
        sum(i * i for i in range(1000))
    wait_for_beats(beating, len(heartbeats(beating)) + 2)
    after = heartbeats(beating)[-1]
    assert slept[-1]["cpu_s"] - slept[0]["cpu_s"] < 0.1
    assert after["cpu_s"] - before["cpu_s"] >= 0.2
    # what the main thread got plus what it waited for: about the wall time it spun
    assert isinstance(after["runq_s"], float) and after["runq_s"] >= before["runq_s"]


def test_library_code_is_not_the_users():
    import json as stdlib_module

    import torch

    import ddpdoctor.runtime.heartbeat as ours

    assert not is_user_file(stdlib_module.__file__)
    assert not is_user_file(torch.__file__)
    assert not is_user_file(ours.__file__)
    assert not is_user_file("<frozen importlib._bootstrap>")
    assert is_user_file(__file__)


def test_children_cpu_counts_the_workers_of_the_main_thread():
    import subprocess
    import sys

    from ddpdoctor.runtime.progress_probe import children_cpu_seconds

    before = children_cpu_seconds()
    spin = "import time\nend = time.time() + 20\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 15
        while (children_cpu_seconds() or 0.0) < 0.1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert before is not None and children_cpu_seconds() >= 0.1
    finally:
        child.kill()
        child.wait(5)


def test_current_frames_turns_the_collector_off_for_the_call_only(monkeypatch):
    """sys._current_frames() from the heartbeat thread can start a garbage collection inside
    CPython's thread-list lock and hang the process (gh-106883, Python before 3.11.9): the probe
    turns the collector off around it, and leaves it as the job had it."""
    import gc
    import sys
    import threading

    from ddpdoctor.runtime import progress_probe

    seen: list[bool] = []
    real = sys._current_frames

    def spying():
        seen.append(gc.isenabled())
        return real()

    monkeypatch.setattr(sys, "_current_frames", spying)
    assert gc.isenabled()
    frames = progress_probe.current_frames()
    assert threading.main_thread().ident in frames
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        progress_probe.current_frames()
        assert seen[-1] is False and not gc.isenabled()  # the job's choice stays
    finally:
        gc.enable()


def test_heartbeats_count_the_fatal_errors_the_process_wrote(beating):
    """A watcher tells an error line of the rank's own from one appended to its file by the
    heartbeats' count (ddpdoctor/monitor/model/own_lines.py)."""
    wait_for_beats(beating, 1)
    assert heartbeats(beating)[-1]["errors"] == 0
    beating.emit("error", exc_type="OSError", message="a thread's", fatal=False)
    beating.emit("error", exc_type="RuntimeError", message="boom", fatal=True)
    seen = len(heartbeats(beating))
    wait_for_beats(beating, seen + 2)
    assert heartbeats(beating)[-1]["errors"] == 1


def test_counted_calls_are_written_at_their_own_pace_and_their_last_number_when_quiet(tmp_path):
    """A gradient-sync count that keeps climbing is written every COUNTS_EVERY_S, not at each
    flush; once the loop goes quiet (a rank blocked in a collective) its last number is on disk
    within a flush or two, long before any hang threshold."""
    from ddpdoctor.runtime.heartbeat import COUNTS_EVERY_S
    from ddpdoctor.runtime.records import CollectiveDesc

    runtime = Runtime(tmp_path / "run", rank=0)
    runtime.run_dir.events_dir.mkdir(parents=True)
    desc = CollectiveDesc(
        "ddp_gradient_sync",
        GroupInfo("default:ddp_grads", 1, None),
        TensorSummary(),
        is_async=False,
    )
    desc.immediate = False
    counted = runtime.collectives.counter(desc)
    heartbeat = Heartbeat(runtime, period_s=30.0, gpu_memory=lambda rt: None)
    heartbeat.start()
    path = runtime.run_dir.events_file(0)

    def counts() -> list[int]:
        events = [parse_event_line(line) for line in path.read_bytes().split(b"\n")]
        return [e["seq"] for e in events if e and e["kind"] == "collective_start"]

    try:
        wait_for_beats(runtime, 1)
        start = time.monotonic()
        while time.monotonic() - start < 4 * COUNTS_EVERY_S:  # a training loop: steps flow
            counted.count += 1
            runtime.emit("metrics", i=counted.count)  # queued, as a step is
            time.sleep(0.002)
        flowing = time.monotonic() - start
        last = counted.count
        deadline = time.monotonic() + 5
        while not counts() or counts()[-1] != last:
            assert time.monotonic() < deadline, "the last count was not written once quiet"
            time.sleep(0.01)
        assert time.monotonic() - (start + flowing) < 3.0
        # at its own pace while it flowed: one write per COUNTS_EVERY_S, and one per quiet
        # spell (a loaded machine may pause this thread for a flush or two); at every flush
        # (every 0.1 s while flowing, as before) it would be twice this bound
        assert len(counts()) <= 2 * flowing / COUNTS_EVERY_S + 4
        assert counts() == sorted(counts())
    finally:
        heartbeat.stop()
