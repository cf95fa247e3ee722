"""When an op ends: the return, a future, a Work, or (on GPU) a CUDA event polled later.

The GPU paths run here with injected probes standing in for CUDA events and NCCL Works; the same
paths run for real in tests/integration/test_runtime_gpu.py on a machine with a GPU.
"""

from __future__ import annotations

from ddpdoctor.runtime import completion
from ddpdoctor.runtime.collectives import CollectiveTracker, GroupInfo, TensorSummary, summarize
from ddpdoctor.runtime.records import as_event


class Recorder:
    """Stands in for Runtime.record: the events the records encode to, and how they were sent."""

    def __init__(self):
        self.events = []

    def __call__(self, record, immediate=False):
        self.events.append({**as_event(record), "immediate": immediate})

    def ends(self):
        return [e for e in self.events if e["kind"] == "collective_end"]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeWork:
    """A Work whose completion is switched by the test (an NCCL Work's CUDA end event)."""

    def __init__(self, future=None):
        self.completed = False
        self._future = future

    def is_completed(self):
        return self.completed

    def get_future(self):
        if self._future is None:
            raise RuntimeError("Work::getFuture not implemented")  # gloo send/recv
        return self._future


class FakeFuture:
    def __init__(self, error=None):
        self.callbacks = []
        self.error = error

    def add_done_callback(self, callback):
        self.callbacks.append(callback)

    def value(self):
        if self.error:
            raise self.error
        return [1]

    def complete(self):
        for callback in self.callbacks:
            callback(self)


def tracker_and_events():
    events, clock = Recorder(), FakeClock()
    return CollectiveTracker(events, clock, lambda: 1.7e9), events, clock


def start(tracker, op="all_reduce"):
    return tracker.start(
        op, GroupInfo("default", 2), TensorSummary(((4,),), ("float32",), 4, True), is_async=False
    )


def test_blocking_gpu_op_ends_when_the_cuda_event_passes():
    tracker, events, clock = tracker_and_events()
    passed = [False]
    rec = start(tracker)
    clock.now += 0.001  # the Python call returns at once: NCCL only enqueued the op
    completion.finish_blocking(tracker, rec, on_gpu=True, cuda_marker=lambda: lambda: passed[0])
    assert tracker.poll() == 0 and events.ends() == []
    assert tracker.oldest_open()["op"] == "all_reduce"
    clock.now += 2.5  # the kernel finishes later
    passed[0] = True
    assert tracker.poll() == 1
    (end,) = events.ends()
    assert end["via"] == "cuda_event"
    assert end["duration_s"] == 2.501
    assert not tracker.polling


def test_blocking_cpu_op_ends_on_return():
    tracker, events, clock = tracker_and_events()
    rec = start(tracker)
    clock.now += 0.25
    completion.finish_blocking(tracker, rec, on_gpu=False, cuda_marker=None)
    (end,) = events.ends()
    assert (end["via"], end["duration_s"], end["ok"]) == ("return", 0.25, True)


def test_without_a_usable_cuda_event_the_return_ends_it():
    tracker, events, _ = tracker_and_events()

    def broken_marker():
        raise RuntimeError("CUDA error: no kernel image")

    completion.finish_blocking(tracker, start(tracker), on_gpu=True, cuda_marker=broken_marker)
    assert [e["via"] for e in events.ends()] == ["return"]


def test_async_gpu_work_is_polled():
    tracker, events, _ = tracker_and_events()
    work = FakeWork(future=FakeFuture())  # a CUDA future completes on enqueue: not trusted
    completion.finish_async(tracker, start(tracker), work, on_gpu=True)
    tracker.poll()
    assert events.ends() == []
    work.completed = True
    tracker.poll()
    assert [e["via"] for e in events.ends()] == ["work"]


def test_async_cpu_work_ends_by_its_future():
    tracker, events, _ = tracker_and_events()
    future = FakeFuture()
    completion.finish_async(tracker, start(tracker), FakeWork(future), on_gpu=False)
    assert events.ends() == []
    future.complete()
    assert [(e["via"], e["ok"]) for e in events.ends()] == [("future", True)]


def test_a_failed_future_is_recorded_as_failed():
    tracker, events, _ = tracker_and_events()
    future = FakeFuture(error=RuntimeError("Connection closed by peer"))
    completion.finish_async(tracker, start(tracker), future, on_gpu=False)
    future.complete()
    (end,) = events.ends()
    assert end["ok"] is False
    assert end["error"] == "RuntimeError: Connection closed by peer"


def test_gloo_p2p_work_without_future_is_polled():
    tracker, events, _ = tracker_and_events()
    work = FakeWork(future=None)
    completion.finish_async(tracker, start(tracker, "isend"), work, on_gpu=False)
    assert tracker.polling
    work.completed = True
    tracker.poll()
    assert [e["via"] for e in events.ends()] == ["work"]


def test_a_list_of_works_ends_when_all_are_done():
    tracker, events, _ = tracker_and_events()
    works = [FakeWork(), FakeWork()]
    completion.finish_async(tracker, start(tracker, "batch_isend_irecv"), works, on_gpu=False)
    works[1].completed = True
    tracker.poll()
    assert events.ends() == []
    works[0].completed = True
    tracker.poll()
    assert len(events.ends()) == 1


def test_gpu_bucket_ends_with_the_works_its_hook_started():
    tracker, events, _ = tracker_and_events()
    inner = FakeWork()
    future = FakeFuture()
    completion.finish_async(tracker, start(tracker), future, on_gpu=True, works=[inner])
    future.complete()  # ignored on GPU: the inner Work decides
    tracker.poll()
    assert events.ends() == []
    inner.completed = True
    tracker.poll()
    assert [e["via"] for e in events.ends()] == ["work"]


def test_none_result_ends_at_once():
    tracker, events, _ = tracker_and_events()
    completion.finish_async(tracker, start(tracker), None, on_gpu=False)
    assert [e["via"] for e in events.ends()] == ["return"]


def test_an_op_ends_once_and_calls_its_end_callback():
    tracker, events, clock = tracker_and_events()
    seen = []
    rec = start(tracker)
    rec.on_end = seen.append
    clock.now += 1
    assert tracker.end(rec) == 1.0
    assert tracker.end(rec, ok=False, error="late") is None
    assert len(events.ends()) == 1 and seen == [101.0]
    assert (tracker.started, tracker.done) == (1, 1)


def test_only_gradient_buckets_wait_in_the_queue():
    tracker, events, _ = tracker_and_events()
    group, tensors = GroupInfo("default", 2), TensorSummary(((4,),), ("float32",), 4)
    call = tracker.start("all_reduce", group, tensors, is_async=False)
    bucket = tracker.start("all_reduce", group, tensors, is_async=True, bucket=0)
    send = tracker.start("send", group, tensors, is_async=False, p2p=True, peer=1)
    for rec in (call, bucket, send):
        tracker.end(rec)
    sent = [(e["kind"], e["op"], e.get("bucket"), e["immediate"]) for e in events.events]
    # the start of the call a rank may die in must be on disk before the call; the rest can wait
    assert sent == [
        ("collective_start", "all_reduce", None, True),
        ("collective_start", "all_reduce", 0, False),
        ("collective_start", "send", None, True),
        ("collective_end", "all_reduce", None, False),
        ("collective_end", "all_reduce", None, False),
        ("collective_end", "send", None, False),
    ]
    assert [e["seq"] for e in events.events if e["kind"] == "collective_start"] == [1, 2, 1]


def test_a_distinct_call_is_described_once():
    tracker, _, _ = tracker_and_events()
    group = GroupInfo("default", 2)
    first = tracker.start(
        "all_reduce", group, TensorSummary(((4,),), ("float32",), 4), is_async=False
    )
    again = tracker.start(
        "all_reduce", group, TensorSummary(((4,),), ("float32",), 4), is_async=False
    )
    other = tracker.start(
        "all_reduce", group, TensorSummary(((5,),), ("float32",), 5), is_async=False
    )
    assert first.desc is again.desc and other.desc is not first.desc
    assert (first.seq, again.seq, other.seq) == (1, 2, 3)


def test_p2p_ops_number_per_peer_apart_from_collectives():
    tracker, events, _ = tracker_and_events()
    group = GroupInfo()
    for op, peer in (("send", 1), ("send", 2), ("send", 1)):
        tracker.start(op, group, TensorSummary(), is_async=False, p2p=True, peer=peer)
    tracker.start("barrier", group, TensorSummary(), is_async=False)
    starts = [(e["op"], e.get("peer"), e["seq"]) for e in events.events]
    assert starts == [("send", 1, 1), ("send", 2, 1), ("send", 1, 2), ("barrier", None, 1)]
    assert tracker.last_seqs() == {"default": 1}


def test_summary_caps_shapes_but_counts_every_element():
    class T:
        def __init__(self, *shape):
            self.shape = shape
            self.dtype = "torch.bfloat16"

    summary = summarize([T(2, 3)] * 20, limit=8)
    assert summary.numel == 120
    assert len(summary.shapes) == 8 and summary.shapes[0] == (2, 3)
    assert summary.dtypes[0] == "bfloat16"
    assert summarize([]).numel is None
