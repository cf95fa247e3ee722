"""When a collective is over: the moment its `collective_end` event is written.

    gloo, blocking call         when the Python call returns
    gloo, async (Work, Future)  when its future completes (a callback), else when the Work says
                                so (polled by the heartbeat thread: gloo send/recv have no future)
    GPU (NCCL), blocking call   when a CUDA event recorded on the current stream right after the
                                call has passed: NCCL returns to Python when the op is enqueued,
                                and the current stream waits for it, so the event completes with it
    GPU, async                  when the Work's own CUDA end event has passed (is_completed()),
                                polled by the heartbeat thread

Probes never block and are polled by the heartbeat thread, never by the training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ddpdoctor.runtime.collectives import CollectiveTracker, OpenCollective, Probe

# A factory of GPU completion probes: records a marker now, returns "has it passed?".
CudaMarker = Callable[[], Probe]


def default_cuda_marker() -> Probe:
    import torch

    event = torch.cuda.Event()
    event.record()  # on the current stream, which the blocking collective made wait for NCCL
    return event.query


def finish_blocking(
    tracker: CollectiveTracker,
    rec: OpenCollective,
    *,
    on_gpu: bool,
    cuda_marker: CudaMarker | None,
) -> None:
    """A call that did not ask for async_op returned."""
    if on_gpu and cuda_marker is not None:
        try:
            tracker.watch(rec, cuda_marker(), "cuda_event")
            return
        except Exception:  # noqa: BLE001 - no usable CUDA event: fall back to the return
            pass
    tracker.end(rec, via="return")


def finish_async(
    tracker: CollectiveTracker,
    rec: OpenCollective,
    result: Any,
    *,
    on_gpu: bool,
    works: Sequence[Any] = (),
) -> None:
    """An async call returned `result` (a Work, a list of Works, a Future or None).

    `works` are Works made by calls nested inside this one (a DDP comm hook's all_reduce); on GPU
    they, not the returned Future, tell when the op is done: a CUDA future completes on enqueue."""
    if on_gpu and works:
        tracker.watch(rec, _all_completed(works), "work")
        return
    if result is None:  # this rank is not in the group, or the op had nothing to do
        tracker.end(rec, via="return")
        return
    if isinstance(result, list | tuple):
        if not result:
            tracker.end(rec, via="return")
        else:
            tracker.watch(rec, _all_completed(result), "work")
        return
    if on_gpu and hasattr(result, "is_completed"):
        tracker.watch(rec, result.is_completed, "work")
        return
    future = _future_of(result)
    if future is not None:
        try:
            future.add_done_callback(_ender(tracker, rec))
            return
        except Exception:  # noqa: BLE001 - fall through to polling
            pass
    if hasattr(result, "is_completed"):
        tracker.watch(rec, result.is_completed, "work")
        return
    tracker.end(rec, via="return")


def _future_of(result: Any) -> Any | None:
    if hasattr(result, "add_done_callback"):
        return result
    get_future = getattr(result, "get_future", None)
    if get_future is None:
        return None
    try:
        return get_future()
    except Exception:  # noqa: BLE001 - gloo send/recv Works have no future
        return None


def _ender(tracker: CollectiveTracker, rec: OpenCollective) -> Callable[[Any], None]:
    def on_done(future: Any) -> None:
        try:
            future.value()  # complete already: raises only when the op failed
        except Exception as exc:  # noqa: BLE001 - report, never raise into the comm thread
            tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}", via="future")
            return
        tracker.end(rec, via="future")

    return on_done


def _all_completed(works: Sequence[Any]) -> Probe:
    pending = list(works)

    def probe() -> bool:
        while pending:
            if not pending[-1].is_completed():
                return False
            pending.pop()
        return True

    return probe
