"""Training steps as the hooks see them: DataLoader fetches, DDP forwards, gradient buckets.

A step is everything from the first fetch (or forward) of an iteration to the first fetch (or
forward) of the next one, and it counts only when it ran a training forward with gradient sync:
forwards under `no_sync` accumulate into the next synced step, eval forwards are not steps. The
`step` event is written when the step closes: at the next iteration, at a phase change, at the end
of the loader or of the process. Its timings split the step's wall time:

    data_time_s     waiting in DataLoader `__next__`
    comm_wait_s     blocking collectives on the training thread, plus the gradient all-reduce
                    time not hidden behind backward: last bucket launched -> last bucket done
                    with the bucket hook (--ddp-buckets); by default what DDP's own timers
                    measured for a recent iteration (ddp_hooks.CommProbe), for each step
    compute_time_s  the rest

The training thread only adds up times; the `step` event is a hot-path record (records.py) whose
split is worked out by the writer thread.

On a straggler the numbers tell the story: the slow rank has the most data + compute time while
the others' comm_wait_s grows by the same amount (they wait for it inside the all-reduce).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ddpdoctor.runtime import records
from ddpdoctor.runtime.records import Record


class OpenStep:
    """The step in progress (mutable; internal to the tracker and the bucket callbacks)."""

    __slots__ = (
        "bucket_done",
        "bucket_launch",
        "closed",
        "comm_s",
        "data_s",
        "forwards",
        "loss",
        "samples",
        "stale",
        "start",
        "synced",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.data_s = 0.0
        self.comm_s = 0.0
        self.samples = 0
        self.forwards = 0
        self.synced = False
        self.stale = False  # an eval forward ran since: the next fetch starts afresh
        self.loss: float | None = None
        self.bucket_launch: float | None = None
        self.bucket_done: float | None = None
        self.closed = False


class StepTracker:
    def __init__(
        self,
        record: Callable[[Record], None],
        mono_clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # where a closed step goes: the runtime's record() until the rank's writer exists, then
        # the writer's enqueue itself (core.Runtime sets it)
        self.sink: Callable[[Record], None] = record
        self._mono = mono_clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._open: OpenStep | None = None
        self._fetch_epoch: int | None = None
        self.steps_done = 0
        self.epoch: int | None = None
        # The gradient all-reduce wait per step as DDP's timers measured it lately (seconds),
        # for steps that no bucket hook timed (set by ddp_hooks.CommProbe).
        self.ddp_comm_s = 0.0

    @property
    def current(self) -> int:
        """The number of the step in progress, or of the last one when none is."""
        step = self._open
        if step is not None and step.forwards:
            return self.steps_done + 1
        return self.steps_done

    def on_fetch(self, t0: float, t1: float, exhausted: bool, epoch: int | None) -> None:
        """A DataLoader `__next__` that ran from t0 to t1 (exhausted: it raised StopIteration)."""
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced:
                closed = self._close(step, t0)
                step = None
            if not exhausted:
                if step is None or step.stale:
                    step = self._open = OpenStep(t0)
                step.data_s += t1 - t0
                self._fetch_epoch = epoch
        if closed is not None:
            self.sink(closed)

    def on_forward(self, t: float, training: bool, synced: bool, batch_size: int | None) -> None:
        """A DDP forward: training (train mode, grad enabled), synced (not under no_sync)."""
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced:
                closed = self._close(step, t)
                step = None
            if not training:
                if step is not None:
                    step.stale = True
            else:
                if step is None or step.stale:
                    step = self._open = OpenStep(t)
                step.forwards += 1
                if batch_size:
                    step.samples += batch_size
                if synced:
                    step.synced = True
                if self._fetch_epoch is not None:
                    self.epoch = self._fetch_epoch
        if closed is not None:
            self.sink(closed)

    def on_comm_wait(self, seconds: float) -> None:
        """Time the training thread spent blocked in a collective."""
        step = self._open
        if step is not None:
            step.comm_s += seconds

    def on_bucket_launch(self, t: float) -> OpenStep | None:
        """A gradient bucket's all-reduce was launched; returns the step it belongs to (the
        bucket's end sets its bucket_done: see collectives.CollectiveTracker.end)."""
        step = self._open
        if step is not None:
            launched = step.bucket_launch
            if launched is None or t > launched:
                step.bucket_launch = t
        return step

    def on_bucket_done(self, token: OpenStep | None, t: float) -> None:
        if token is not None and not token.closed:
            done = token.bucket_done
            token.bucket_done = t if done is None or t > done else done

    def on_loss(self, loss: float) -> None:
        step = self._open
        if step is not None:
            step.loss = loss

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def flush(self) -> None:
        """Close a synced step now (the loop ended, the phase changed, the process is exiting)."""
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced:
                closed = self._close(step, self._mono())
        if closed is not None:
            self.sink(closed)

    def _close(self, step: OpenStep, t: float) -> Record:
        self._open = None
        step.closed = True
        self.steps_done += 1
        exposed = 0.0
        launched, done = step.bucket_launch, step.bucket_done
        if launched is not None and done is not None and done > launched:
            exposed = done - launched
        elif launched is None:
            exposed = self.ddp_comm_s
        return (
            records.step,
            self._wall(),
            self._mono(),
            self.steps_done,
            self.epoch,
            step.loss,
            step.samples,
            step.forwards,
            t - step.start,
            step.data_s,
            step.comm_s + exposed,
        )
