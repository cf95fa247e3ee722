"""DistributedDataParallel: training steps from forwards, gradient buckets from a comm hook.

Steps: a forward with grad enabled may train; with `require_backward_grad_sync` (not under
`no_sync`) it is the one that syncs gradients, and it makes a step once something confirms that it
trained: the module in train mode, an optimizer step (optim_hooks.py) or a gradient bucket
(steps.py). A forward under `no_grad` / `inference_mode` is evaluation.

Phases: until the script (or a framework's hooks: frameworks.py) names a phase, a forward in train
mode with grad, or an optimizer step, puts the rank in phase "train", and a forward under
`no_grad` in "eval", so a script that never heard of ddpdoctor still shows what it does.

Buckets, by default: DDP keeps its built-in C++ all-reduce, and the state of every gradient
bucket's collective (scheduled, started, completed, by sequence number, with sizes and dtypes) is
read from PyTorch's flight recorder when the monitor asks (runtime/flight_recorder.py). A Python
hook per bucket costs ~80 µs a step on a small model; the recorder costs nothing until asked.
`DDPDOCTOR_DDP_BUCKETS=1` (`ddpdoctor run --ddp-buckets`) records every bucket as events with the
hook below instead, and a torch without a usable flight recorder gets the hook anyway.

Buckets, with the hook: DDP reduces gradients bucket by bucket through one communication hook. ddpdoctor's hook
records each bucket (op "all_reduce", `bucket` index) and delegates to the hook that would
otherwise run: torch's default allreduce hook (the same result as DDP without a hook), or the one
the user registers. DDP takes one registration only, so ddpdoctor registers its hook as late as it
can, at the first training forward; a `register_comm_hook` call before that is wrapped, one after
it replaces the hook ddpdoctor delegates to. Either way the user's call works as without
ddpdoctor. A builtin C++ hook (`_register_builtin_comm_hook`) cannot be wrapped: it is left alone
and a `warning` event says that the model's buckets go unrecorded; registered after ddpdoctor's
hook, it runs as its Python equivalent instead, since DDP would refuse a second registration.

The hook runs once per bucket per step, so it does little: a bucket's description (shape, dtype,
group, as event text) is made once per bucket and kept in the model's HookSlot.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.events import WARNING
from ddpdoctor.runtime import completion, core
from ddpdoctor.runtime.c10d_hooks import GROUPS, NESTING
from ddpdoctor.runtime.collectives import summarize
from ddpdoctor.runtime.flight_recorder import recorder_status
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch
from ddpdoctor.runtime.records import CollectiveDesc

# "1": a Python comm hook records every gradient bucket as events (`ddpdoctor run --ddp-buckets`);
# "0": no hook and no flight-recorder mention either; unset: DDP's own C++ all-reduce, its buckets
# read from PyTorch's flight recorder on demand (the hook where the recorder is not usable).
ENV_BUCKETS = "DDPDOCTOR_DDP_BUCKETS"
MODE_HOOK = "python_hook"
MODE_RECORDER = "flight_recorder"
MODE_OFF = "off"
# On a DDP model: its HookSlot once ddpdoctor's hook is registered, False when ddpdoctor keeps
# its hands off (a builtin hook, no reducer, a failed registration); absent before the decision.
SLOT_ATTR = "_ddpdoctor_comm_hook_slot"
ONCE_ERROR = "register_comm_hook or register_builtin_comm_hook can only be called once."
# Bucket descriptions kept per model (a bucket is described again after DDP rebuilds them).
MAX_BUCKET_DESCRIPTIONS = 1024


def bucket_mode(environ: Any = os.environ) -> tuple[bool, dict[str, str]]:
    """(register the Python hook?, {"mode", "why"} for the hello event)."""
    value = str(environ.get(ENV_BUCKETS, "")).strip().lower()
    if value in ("1", "true", "yes", "on"):
        why = f"{ENV_BUCKETS}={value} (ddpdoctor run --ddp-buckets): every bucket is an event"
        return True, {"mode": MODE_HOOK, "why": why}
    if value in ("0", "false", "no", "off"):
        return False, {"mode": MODE_OFF, "why": f"{ENV_BUCKETS}={value}: buckets unrecorded"}
    usable, why = recorder_status()
    if usable:
        return False, {"mode": MODE_RECORDER, "why": why}
    return True, {"mode": MODE_HOOK, "why": f"Python hook fallback: {why}"}


def _allreduce_hook() -> Callable[..., Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook


class HookSlot:
    """What ddpdoctor's comm hook delegates to (mutable: a later user registration swaps it),
    and what it learned about the model's buckets."""

    __slots__ = (
        "buckets",
        "group",
        "hook",
        "is_default",
        "opts",
        "pg",
        "state",
        "user_registered",
        "world",
    )

    def __init__(self, hook: Callable[..., Any], state: Any, group: Any, *, user: bool) -> None:
        self.group = group
        self.buckets: dict[Any, CollectiveDesc] = {}
        self.pg: Any = None  # resolved at the first bucket, with world and opts
        self.world = 1
        self.opts: Any = None
        self.delegate_to(hook, state, user=user)

    def delegate_to(self, hook: Callable[..., Any], state: Any, *, user: bool) -> None:
        self.hook = hook
        self.state = state
        self.user_registered = user
        # torch's default hook is run inline, with the end recorded in its one callback
        self.is_default = hook is _allreduce_hook()

    def describe(self, key: tuple[int, int, Any], buffer: Any) -> CollectiveDesc | None:
        """A bucket's description, made once (key: index, numel, dtype of its flat buffer)."""
        group = GROUPS.describe(self.group)
        if group is None:
            return None
        if self.pg is None:
            import torch.distributed as dist

            pg = self.group if self.group is not None else dist.group.WORLD
            assert pg is not None  # a DDP model exists only inside a process group
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            if hasattr(opts, "asyncOp"):
                opts.asyncOp = True
            self.world, self.opts, self.pg = int(pg.size()), opts, pg
        desc = CollectiveDesc(
            "all_reduce", group, summarize([buffer]), is_async=True, bucket=key[0]
        )
        if len(self.buckets) >= MAX_BUCKET_DESCRIPTIONS:
            self.buckets.clear()
        self.buckets[key] = desc
        return desc


# DDP inspects a hook: a function with a __name__, a parameter named `bucket`, and no annotations
# other than GradBucket / Future[Tensor] (string annotations fail its check): none here.
def ddpdoctor_comm_hook(slot, bucket):
    """Run the delegate hook for one bucket, recorded as one all_reduce of the DDP group."""
    runtime = core._active
    if runtime is None:
        return slot.hook(slot.state, bucket)
    try:
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.numel(), buffer.dtype)
        desc = slot.buckets.get(key)
        if desc is None:
            desc = slot.describe(key, buffer)
    except Exception:  # noqa: BLE001 - never stand between DDP and its gradients
        desc = None
    if desc is None:
        return slot.hook(slot.state, bucket)
    tracker = runtime.collectives
    rec = tracker.begin(desc)
    rec.step = runtime.steps.on_bucket_launch(rec.start_mono)
    if slot.is_default and not desc.on_gpu:
        return _allreduce_recorded(slot, buffer, tracker, rec)
    works: list[Any] = []
    outer_capture = NESTING.capture
    NESTING.depth += 1
    NESTING.capture = works
    try:
        future = slot.hook(slot.state, bucket)
    except BaseException as exc:
        tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        NESTING.depth -= 1
        NESTING.capture = outer_capture
    try:
        completion.finish_async(tracker, rec, future, on_gpu=desc.on_gpu, works=works)
    except Exception:  # noqa: BLE001
        tracker.end(rec, via="return")
    return future


def _allreduce_recorded(slot: HookSlot, buffer: Any, tracker: Any, rec: Any) -> Any:
    """torch's default allreduce hook (average, then all-reduce: DDP's result without a hook),
    with the end recorded in the one `then` callback it has anyway: on the hot path, a second
    Python callback per bucket would cost a GIL hand-over on the communication thread."""
    buffer.div_(slot.world)
    try:
        work = slot.pg.allreduce([buffer], slot.opts)
    except BaseException as exc:
        tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}")
        raise

    def reduced(future: Any) -> Any:
        try:
            value = future.value()[0]
        except Exception as exc:
            tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}", via="future")
            raise
        tracker.end(rec, via="future")
        return value

    return work.get_future().then(reduced)


# Without the bucket hook, the gradient all-reduce time not hidden behind backward (what a
# straggler's peers wait) comes from DDP's own C++ timers (its Logger): comm end - compute end of
# a sampled iteration. Reading them costs ~25 µs (~100 µs on a loaded machine, where the caches
# are cold), so it happens once a COMM_READ_EVERY_S, on the training thread at a forward (where
# DDP writes them too: no race), and the latest sample stands for the steps until the next read.
# DDP times one iteration in `sample rate` (its default 100, and the first 10); timing one costs
# ~10 µs of CPU, so on CPU the rate is set for a sample every SAMPLE_EVERY_S or so: every 12th
# step of a 20 ms step, one in 100 of a 2 ms one. Reading as often as DDP samples keeps the
# figure within a step or two of the step it stands for (read once a second, a 0.3 s step's
# wait stood for the next three, and a straggler's peers looked slow themselves); at 2 ms steps
# that is one read in 125 steps, under 1 µs a step. A CUDA model keeps DDP's default: its timers
# synchronize the device. Until the first read the steps have no split (steps.ddp_comm_s None).
SAMPLE_EVERY_S = 0.25
COMM_READ_EVERY_S = SAMPLE_EVERY_S
MAX_SAMPLE_RATE = 100  # DDP's default
PROBE_ATTR = "_ddpdoctor_comm_probe"


class CommProbe:
    """Reads DDP's runtime stats of one model now and then (mutable; kept on the model)."""

    __slots__ = ("adapt", "iteration", "next_t", "rate", "read_t")

    def __init__(self, t: float, adapt: bool, rate: int) -> None:
        self.next_t = t + COMM_READ_EVERY_S
        self.read_t = t
        self.adapt = adapt  # set DDP's sample rate from the step time (CPU models)
        self.rate = rate
        self.iteration = 0

    def read(self, ddp: Any, steps: Any, t: float) -> None:
        self.next_t = t + COMM_READ_EVERY_S
        logger = getattr(ddp, "logger", None)
        if logger is None:
            steps.ddp_comm_s = steps.ddp_comm_s or 0.0  # no timers: the wait counts as compute
            return
        data = logger._get_ddp_logging_data().ints_map  # ns and counts
        iteration = int(data.get("iteration") or 0)
        if iteration <= self.iteration:
            return
        end, compute_end = data.get("backward_comm_time_end"), data.get("backward_compute_time_end")
        if isinstance(end, int) and isinstance(compute_end, int) and end and compute_end:
            steps.ddp_comm_s = max(0, end - compute_end) / 1e9
        elif steps.ddp_comm_s is None:  # timers that say nothing: as before them
            steps.ddp_comm_s = 0.0
        if self.adapt and self.iteration:
            per_iteration = (t - self.read_t) / (iteration - self.iteration)
            wanted = int(SAMPLE_EVERY_S / per_iteration) if per_iteration > 0 else 1
            rate = max(1, min(MAX_SAMPLE_RATE, wanted))
            if rate != self.rate:
                ddp._set_ddp_runtime_logging_sample_rate(rate)
                self.rate = rate
        self.iteration, self.read_t = iteration, t


def start_probe(ddp: Any, t: float, steps: Any) -> CommProbe | bool:
    """At a model's first synced training forward without the bucket hook."""
    try:
        adapt = getattr(ddp, "device_type", "cpu") != "cuda"
        if adapt:  # sample every iteration until the step time is known
            ddp._set_ddp_runtime_logging_sample_rate(1)
        probe: CommProbe | bool = CommProbe(t, adapt, 1 if adapt else MAX_SAMPLE_RATE)
        if getattr(ddp, "logger", None) is not None:
            steps.ddp_comm_s = None  # the steps before the first read have no split
    except Exception:  # noqa: BLE001 - no timing rather than no training
        probe = False
    setattr(ddp, PROBE_ATTR, probe)
    return probe


def batch_size_of(inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The leading dimension of the first tensor among the forward's arguments (one level deep)."""
    for value in (*inputs, *kwargs.values()):
        for item in _one_level(value):
            shape = getattr(item, "shape", None)
            if shape is not None and hasattr(item, "dtype"):
                return int(shape[0]) if len(shape) else None
    return None


def _one_level(value: Any) -> Any:
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, list | tuple):
        return value
    return (value,)


def ensure_hook(ddp: Any, rt: core.Runtime, register: Callable[..., Any]) -> None:
    """At a model's first training forward with `--ddp-buckets`: ddpdoctor's comm hook, through
    DDP's own `register` (not ddpdoctor's wrapper of it)."""
    setattr(ddp, SLOT_ATTR, False)  # one attempt per model, whatever happens below
    if getattr(ddp, "_use_python_reducer", False) or getattr(
        ddp, "_delay_all_reduce_all_params", False
    ):
        return  # no reducer buckets to hook
    slot = HookSlot(_allreduce_hook(), ddp.process_group, ddp.process_group, user=False)
    try:
        register(ddp, slot, ddpdoctor_comm_hook)
    except Exception as exc:  # noqa: BLE001 - train unrecorded rather than not at all
        rt.emit(
            WARNING,
            code="ddp.comm_hook_failed",
            message=f"gradient buckets are not recorded: {type(exc).__name__}: {exc}",
            details={},
        )
        return
    setattr(ddp, SLOT_ATTR, slot)


def install(runtime: core.Runtime) -> None:
    """The bucket mode, and DDP's comm-hook registrations wrapped (its forward: ddp_forward.py)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_register = DDP.register_comm_hook
    original_builtin = DDP._register_builtin_comm_hook
    if hasattr(original_register, WRAPPED_MARK):
        return

    record_buckets, runtime.bucket_recording = bucket_mode()

    @functools.wraps(original_register)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        slot = self.__dict__.get(SLOT_ATTR)
        if slot is False or (
            slot is None
            and (
                core.active() is None
                or not record_buckets
                or getattr(self, "_use_python_reducer", False)
            )
        ):
            return original_register(self, state, hook)
        self._check_comm_hook(hook)
        if slot is not None:  # ddpdoctor's hook is in place: the user's becomes its delegate
            if slot.user_registered:
                raise RuntimeError(ONCE_ERROR)
            slot.delegate_to(hook, state, user=True)
        else:
            slot = HookSlot(hook, state, self.process_group, user=True)
            original_register(self, slot, ddpdoctor_comm_hook)
            setattr(self, SLOT_ATTR, slot)
        if self.logger is not None:
            self.logger._set_comm_hook_name(getattr(hook, "__qualname__", repr(hook)))
        return None

    @functools.wraps(original_builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        slot = self.__dict__.get(SLOT_ATTR)
        rt = core.active()
        if isinstance(slot, HookSlot) and not slot.user_registered:
            substitute = _python_equivalent(comm_hook_type)
            if substitute is not None:
                slot.delegate_to(substitute, slot.state, user=True)
                return None
        if rt is not None and slot is None and record_buckets:
            setattr(self, SLOT_ATTR, False)
            rt.emit(
                WARNING,
                code="ddp.builtin_comm_hook",
                message=(
                    f"DDP uses the builtin C++ comm hook {comm_hook_type}: its gradient "
                    "all-reduces are not recorded (other collectives still are)"
                ),
                details={"hook": str(comm_hook_type)},
            )
        return original_builtin(self, comm_hook_type)

    for name, new, old in (
        ("register_comm_hook", register_comm_hook, original_register),
        ("_register_builtin_comm_hook", _register_builtin_comm_hook, original_builtin),
    ):
        patch(runtime, DDP, name, new, old)


def _python_equivalent(comm_hook_type: Any) -> Callable[..., Any] | None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if comm_hook_type == dist.BuiltinCommHookType.ALLREDUCE:
        return default_hooks.allreduce_hook
    if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
        return default_hooks.fp16_compress_hook
    return None
