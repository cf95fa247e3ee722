"""Training steps as the hooks see them: DataLoader fetches, DDP forwards, gradient buckets.

A step is everything from the first fetch (or forward) of an iteration to the first fetch (or
forward) of the next one, and it counts only when it trained: a DDP forward with grad enabled and
gradient sync, confirmed by one of

- an optimizer step (any `torch.optim.Optimizer`, through torch's global step hook: what
  Lightning, accelerate, the HF Trainer and a plain loop all call),
- a gradient bucket's all-reduce (DDP's reducer, seen when the bucket hook records them),
- the module being in train mode at that forward (a loop that updates its weights by hand).

The module's train mode alone cannot be the test: Lightning leaves the DDP wrapper in eval mode
after its sanity check while the module inside trains. A forward under `no_grad` /
`inference_mode` is evaluation; a synced forward with grad that nothing confirms (a validation
loss computed in eval mode without `no_grad`) is not a step either. Forwards under `no_sync`
accumulate into the next synced step. A step without any DDP forward (a model DDP does not wrap)
counts at its optimizer step when a DataLoader fetch opened it. The `step` event is written when
the step closes: at the next iteration, at a phase change, at the end of the loader or of the
process. Its timings split the step's wall time:

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
    """The step in progress (mutable; internal to the tracker and the bucket callbacks).

    One is made per step, so it sets only its start: every other field starts as the class's
    default and becomes the instance's own when first written (a dozen stores a step fewer)."""

    data_s = 0.0
    comm_s = 0.0
    samples = 0
    forwards = 0
    synced = False
    trained = False  # confirmed: an optimizer step, a gradient bucket, train mode
    stale = False  # an eval forward ran since: the next fetch starts afresh
    loss: float | None = None
    bucket_launch: float | None = None
    bucket_done: float | None = None
    closed = False

    def __init__(self, start: float) -> None:
        self.start = start


class StepTracker:
    def __init__(
        self,
        record: Callable[[Record], None],
        mono_clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # where a closed step goes: the runtime's record() until the rank's writer exists, then
        # the writer's write itself (core.Runtime sets it)
        self.sink: Callable[[Record], object] = record
        self._mono = mono_clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._open: OpenStep | None = None
        self._fetch_epoch: int | None = None
        self.steps_done = 0
        self.epoch: int | None = None
        self._ddp_forwards = False  # a DDP forward was seen: only forwards open steps
        self._last_end: float | None = None  # where the last step closed
        # a framework's whole-batch call runs (DeepSpeed's pipeline `train_batch()`): the
        # DataLoader fetches its engine makes inside it are the batch's own, not new iterations
        self.in_batch = False
        # the script (ddpdoctor.log(epoch=...)) or a framework's hooks gave the epoch: it wins
        # over the epoch of the loader that fetched last (which may be a validation loader)
        self._epoch_given = False
        # The gradient all-reduce wait per step as DDP's timers measured it lately (seconds),
        # for steps that no bucket hook timed (set by ddp_hooks.CommProbe). None from a DDP
        # model's first forward until its timers are first read: the steps before that have
        # no split (their wait would count as compute, and make every rank look slow).
        self.ddp_comm_s: float | None = 0.0

    @property
    def current(self) -> int:
        """The number of the step in progress, or of the last one when none is."""
        step = self._open
        if step is not None and step.forwards:
            return self.steps_done + 1
        return self.steps_done

    def on_fetch(self, t0: float, t1: float, exhausted: bool, epoch: int | None) -> None:
        """A DataLoader `__next__` that ran from t0 to t1 (exhausted: it raised StopIteration)."""
        if self.in_batch:  # one of the micro-batches of the batch in progress: its data time
            step = self._open
            if step is not None and not step.stale and not exhausted:
                step.data_s += t1 - t0
                self._fetch_epoch = epoch
            return
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced:
                if step.trained:
                    closed = self._close(step, t0)
                step = None  # untrained: a forward with grad that nothing confirmed
            if not exhausted:
                if step is None or step.stale:
                    step = self._open = OpenStep(t0)
                step.data_s += t1 - t0
                self._fetch_epoch = epoch
        if closed is not None:
            self.sink(closed)

    def on_iteration_start(self, t: float) -> None:
        """A framework says an iteration begins (torchft's quorum at `zero_grad`): like a fetch
        that took no time, for loops that fetch no DataLoader batch and have no DDP forward."""
        self.on_fetch(t, t, False, self._fetch_epoch)

    def on_forward(
        self,
        t: float,
        grad: bool,
        synced: bool,
        batch_size: int | None,
        train_mode: bool = True,
    ) -> None:
        """A DDP forward: grad (enabled: it may train), synced (not under no_sync), train_mode
        (the DDP module's `.training`: confirms the step at once)."""
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced:
                if step.trained:
                    closed = self._close(step, t)
                    step = None
                else:  # a synced forward with grad that trained nothing: not a step
                    step.stale = True
            if not grad:
                if step is not None:
                    step.stale = True
            else:
                self._ddp_forwards = True
                if step is None or step.stale:
                    step = self._open = OpenStep(t)
                step.forwards += 1
                if batch_size:
                    step.samples += batch_size
                if synced:
                    step.synced = True
                    if train_mode:
                        step.trained = True
                if self._fetch_epoch is not None and not self._epoch_given:
                    self.epoch = self._fetch_epoch
        if closed is not None:
            self.sink(closed)

    def on_batch(self, t: float, training: bool, samples: int | None) -> None:
        """A framework's whole-batch call begins (DeepSpeed's pipeline `train_batch()` /
        `eval_batch()`, which run all their micro-batches inside): a training batch is one synced,
        trained step, an evaluation batch ends the step before it. Until `on_batch_end`, the
        fetches of its micro-batches count as its data time: the engine fetches them from a
        DataLoader of its own (`training_data=`) or of the script's (`RepeatingLoader`), and a
        fetch after a trained step would otherwise close it and open another (two steps a batch)."""
        if not training:
            self.flush()
        self.on_forward(t, training, training, samples, training)
        self.in_batch = True

    def on_batch_end(self) -> None:
        self.in_batch = False

    def on_comm_wait(self, seconds: float) -> None:
        """Time the training thread spent blocked in a collective."""
        step = self._open
        if step is not None:
            step.comm_s += seconds

    def on_optimizer_step(self) -> None:
        """An optimizer stepped: the step in progress trained (after its forward: Lightning's
        forward runs inside `optimizer.step(closure)`, before the step hooks' "post").

        Where no DDP forward was ever seen (a model DDP does not wrap, a framework that chose
        not to distribute), the optimizer steps are the steps: each one closes the iteration
        its fetches opened, or, with no fetch since the last step (a loader that fetched ahead
        and ended), one that began where the last step ended."""
        step = self._open
        if step is not None and step.forwards:
            # the usual case, once per step: a DDP forward opened the step (so the forwards
            # were seen and its epoch taken); marking it trained is one store, no lock (a
            # flush closing it meanwhile on another thread has its record made already)
            step.trained = True
            return
        with self._lock:
            step = self._open
            if step is None and not self._ddp_forwards and self._last_end is not None:
                step = self._open = OpenStep(self._last_end)
            if step is not None:
                if not step.forwards:
                    step.synced = True
                step.trained = True
                if (
                    not self._ddp_forwards
                    and not self._epoch_given
                    and self._fetch_epoch is not None
                ):
                    self.epoch = self._fetch_epoch

    def on_bucket_launch(self, t: float) -> OpenStep | None:
        """A gradient bucket's all-reduce was launched; returns the step it belongs to (the
        bucket's end sets its bucket_done: see collectives.CollectiveTracker.end)."""
        step = self._open
        if step is not None:
            step.trained = True  # a gradient-synchronizing backward
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
        self._epoch_given = True

    def flush(self) -> None:
        """Close a trained step now (the loop ended, the phase changed, the process is exiting);
        one not confirmed yet stays open (its optimizer step may be about to come)."""
        closed = None
        with self._lock:
            step = self._open
            if step is not None and step.synced and step.trained:
                closed = self._close(step, self._mono())
        if closed is not None:
            self.sink(closed)

    def _close(self, step: OpenStep, t: float) -> Record:
        self._open = None
        self._last_end = t
        step.closed = True
        done = self.steps_done = self.steps_done + 1
        launched = step.bucket_launch
        comm: float | None
        if launched is None:  # DDP's own all-reduce: its timers' latest figure
            ddp_comm = self.ddp_comm_s
            comm = None if ddp_comm is None else step.comm_s + ddp_comm
        else:  # the bucket hook timed it: last bucket launched -> last bucket done
            finished = step.bucket_done
            exposed = finished - launched if finished is not None and finished > launched else 0.0
            comm = step.comm_s + exposed
        return (
            records.step,
            self._wall(),
            t,  # its mono time: when it closed
            done,
            self.epoch,
            step.loss,
            step.samples,
            step.forwards,
            t - step.start,
            step.data_s,
            comm,
        )
