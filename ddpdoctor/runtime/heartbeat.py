"""The heartbeat thread: proof of life and a view of what the rank is doing, once a second.

A daemon thread, so it never keeps a finished rank alive, and one that needs only the GIL now and
then: it keeps writing while the training thread is blocked in a C++ collective (GIL released),
spins in a Python loop (the interpreter switches threads) or waits for I/O. It also polls the
completion probes of collectives in flight (CUDA events, Works without a future), often while
there are any, checks that the event file still has a name, and writes the events the training
thread queued: ~20 ms after the first one of a quiet spell, in bursts every ~0.25 s while they
keep coming (a training loop), so that it wakes up rarely.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.events import HEARTBEAT
from ddpdoctor.runtime.core import Runtime
from ddpdoctor.runtime.flight_recorder import FrResponder
from ddpdoctor.runtime.progress_probe import progress_fields

# How often the probes of collectives in flight are polled while there are any.
POLL_S = 0.02
# After the first event lands in the writer's empty queue, wait this long for the rest of a burst
# (a step writes a few), then write them in one go.
FLUSH_DELAY_S = 0.02
# While events keep coming (a training loop), write them in bursts this far apart: every wake-up
# of this thread costs ~100 µs of CPU on a busy machine (cold caches, a GIL hand-over), which at
# 50 wake-ups a second was a third of the runtime's cost per step, and ~1 ms a second at 10. A
# step of 5 ms or more is on disk as it closes (core.SLOW_STEP_S) and a collective's start before
# it is entered, whatever this says; what waits are the ends and the fast steps in between.
FLOWING_FLUSH_S = 0.25
# Counted calls (DDP's gradient syncs: one number per model) are written this often while they
# keep counting, and once more when the loop goes quiet (a rank blocked in a collective: its last
# number is on disk within a flush of it): each write is two events to encode, on a busy machine
# ~40 µs of CPU apiece, which at every flush was a fifth of the runtime's cost per step.
COUNTS_EVERY_S = 0.5

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """Resident memory of this process: /proc/self/statm (one read), else psutil."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return None


def gpu_memory_bytes(runtime: Runtime) -> int | None:
    """Memory torch allocated on this rank's GPU; None without CUDA in use (never starts CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or runtime.cuda_device is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.memory_allocated(runtime.cuda_device))
    except Exception:  # noqa: BLE001
        return None


class Heartbeat:
    def __init__(
        self,
        runtime: Runtime,
        *,
        period_s: float | None = None,
        rss: Callable[[], int | None] = rss_bytes,
        gpu_memory: Callable[[Runtime], int | None] = gpu_memory_bytes,
        progress: Callable[[], dict[str, Any]] = progress_fields,
    ) -> None:
        self.runtime = runtime
        self.period_s = max(0.01, period_s if period_s is not None else runtime.heartbeat_s)
        self._rss = rss
        self._gpu_memory = gpu_memory
        self._progress = progress
        self._stop = threading.Event()
        self._queued = threading.Event()
        self._thread: threading.Thread | None = None
        self._fr: FrResponder | None = None  # answers flight-recorder requests, once asked
        self.beats = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self.runtime.wake_on_queued(self._queued.set)
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 2.0) -> None:
        self._stop.set()
        self._queued.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def fields(self) -> dict[str, Any]:
        """One heartbeat's fields (the envelope is added by the runtime)."""
        rt = self.runtime
        try:
            progress = self._progress()
        except Exception:  # noqa: BLE001 - a beat without progress facts is still a beat
            progress = {}
        beat = {
            **progress,
            "seq": self.beats,
            "step": rt.steps.steps_done,
            "epoch": rt.steps.epoch,
            "phase": rt.phase,
            "rss_bytes": self._rss(),
            "gpu_mem_bytes": self._gpu_memory(rt),
            "open": rt.collectives.oldest_open(),
            "collectives_started": rt.collectives.started,
            "collectives_done": rt.collectives.done,
            "errors": rt.fatal_errors,
        }
        position = rt.pipeline_position
        if position is not None:
            beat["pipeline"] = position
        return beat

    def beat(self) -> None:
        self.beats += 1
        self.runtime.emit(HEARTBEAT, **self.fields())
        writer = self.runtime.writer
        if writer is not None:
            writer.check_file()
        self._answer_requests()

    def _answer_requests(self) -> None:
        """The monitor's flight-recorder requests: one stat of the requests folder a beat until
        one comes (the responder, and torch with it, is loaded only then)."""
        responder = self._fr
        if responder is None:
            responder = self._fr = FrResponder(self.runtime)
        responder.poll()

    def _run(self) -> None:
        """Beat every period, and write what the training thread queued.

        Idle, the thread sleeps until the next beat unless the training thread wakes it with the
        first event it queues (written FLUSH_DELAY_S later). While events keep coming it flushes
        every FLOWING_FLUSH_S instead and asks not to be woken: a wake-up per flush would cost
        the training thread a Condition notify and the machine two thread switches."""
        rt = self.runtime
        clock = rt.mono_clock
        next_beat = clock()
        flowing = False  # events came since the last look: stay on the timer
        seen = -1  # the writer's count of queued events at the last look
        next_counts = clock()
        while not self._stop.is_set():
            wrote = False
            try:
                counts = clock() >= next_counts
                if counts:
                    next_counts = clock() + COUNTS_EVERY_S
                rt.collectives.poll(counts)
                writer = rt.writer
                if writer is not None:
                    # events that came in count even when an immediate write (a collective's
                    # start) already took them out of the queue: they keep coming
                    wrote, seen = writer.enqueued != seen, writer.enqueued
                    writer.flush()
                now = clock()
                if now >= next_beat:
                    if rt.finished:
                        return
                    self.beat()
                    next_beat += self.period_s
                    if next_beat <= now:  # fell behind (a stopped VM, a long GC): no burst
                        next_beat = now + self.period_s
            except Exception:  # noqa: BLE001 - the heartbeat must outlive any odd failure
                pass
            wait = next_beat - clock()
            if rt.collectives.polling:
                wait = min(wait, POLL_S)
            if wrote:
                if not flowing:
                    flowing = True
                    rt.wake_on_queued(None)
                self._stop.wait(max(0.0, min(wait, FLOWING_FLUSH_S)))
                continue
            if flowing:  # a quiet spell: be woken by the next event again (then look once more,
                # the counts' last numbers with it)
                flowing = False
                self._queued.clear()
                rt.wake_on_queued(self._queued.set)
                try:
                    rt.collectives.poll()
                except Exception:  # noqa: BLE001
                    pass
                writer = rt.writer
                if writer is not None and writer.pending:
                    continue
            if self._queued.wait(max(0.0, wait)):
                self._queued.clear()
                self._stop.wait(FLUSH_DELAY_S)  # let the rest of a burst come in
