"""DeepSpeed: the engine's forward opens a training step as a DDP or FSDP root forward does.

DeepSpeed's collectives need nothing of their own (`deepspeed.comm` calls `torch.distributed`,
recorded by c10d_hooks.py), and its ZeRO optimizers step the torch optimizer they were given
(optim_hooks.py sees it). What was missing is the step's start: the engine wraps the model in
no DDP and a loop that feeds it tensors fetches from no DataLoader, so its optimizer steps made
no steps and every rank stayed at step 0 (hangs, crashes and chance pairings were reported
without the step they happened at). `DeepSpeedEngine.forward` is wrapped:

- with grad enabled, a forward of the step (synced when the engine is at a gradient
  accumulation boundary: the micro-batches before it accumulate into it), confirmed by the
  optimizer step, or at once when the engine is in train mode;
- under `no_grad` / `inference_mode`, an evaluation: phase "eval" (ddpdoctor's own guess, as for
  an FSDP model), and the step in progress is not continued by it.

DeepSpeed's pipeline engine runs a whole batch in `train_batch()` (`eval_batch()`): its micro-batch
forwards are never at a gradient accumulation boundary, so the batch itself is the step. Both are
wrapped: `train_batch` opens a synced, trained step (closed by the next one, or at exit), and
`eval_batch` is an evaluation; the engine forwards inside them add nothing, nor do the DataLoader
fetches of its micro-batches (the engine's own loader of `training_data=`, or the script's
`RepeatingLoader`): they are the batch's data time, not iterations of their own. The first batch
writes the engine's stage (`stage_id` of `num_stages`) as a `pipeline` event.

At a synced training forward whose replica digest is due, the engine's replicated parameters
(ZeRO stage 0-2) are digested (replica_sources.py). Two attribute lookups, a clock read and an
integer compare per engine forward.
"""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.protocol.events import PIPELINE
from ddpdoctor.runtime import core, replica_sources
from ddpdoctor.runtime.import_hooks import when_imported
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

IN_BATCH = "_ddpdoctor_pipe_batch"  # set on a pipeline engine while its batch runs
DESCRIBED = "_ddpdoctor_pipe_described"  # set on a pipeline engine once its stage is written


def batch_size_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    first = args[0] if args else next(iter(kwargs.values()), None)
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


def on_engine_forward(rt: core.Runtime, engine: Any, args: Any, kwargs: Any) -> None:
    import torch

    if engine.__dict__.get(IN_BATCH):  # a micro-batch of a pipeline batch: the batch is the step
        return
    if torch.is_grad_enabled():
        training = bool(getattr(engine, "training", True))
        if training and rt.auto_phase and rt.phase != core.AUTO_TRAIN:
            rt.set_phase(core.AUTO_TRAIN, auto=True)
        boundary = getattr(engine, "is_gradient_accumulation_boundary", None)
        synced = bool(boundary()) if callable(boundary) else True
        rt.steps.on_forward(rt.mono_clock(), True, synced, batch_size_of(args, kwargs), training)
        if synced and training:  # its replicated parameters may be due for a digest
            replica_sources.on_deepspeed_forward(rt, engine)
    else:
        if rt.auto_phase and rt.phase != core.AUTO_EVAL:
            rt.set_phase(core.AUTO_EVAL, auto=True)
        rt.steps.on_forward(rt.mono_clock(), False, False, None)


def wrap_engine(runtime: core.Runtime, cls: Any) -> None:
    original = vars(cls).get("forward")
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = core._active
        if rt is not None:
            try:
                on_engine_forward(rt, self, args, kwargs)
            except Exception:  # noqa: BLE001 - recording must never break training
                pass
        return original(self, *args, **kwargs)

    patch(runtime, cls, "forward", forward, original)


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe_pipeline(rt: core.Runtime, engine: Any) -> None:
    """The engine's stage, once, as the `pipeline` event a torch pipelining schedule writes at
    its first step: the straggler rule compares a rank only with the ranks of its own stage (the
    stages do different work by design) and a hang names the culprit's stage. The engine's
    send/recv alone cannot say it: point-to-point calls are not among a rank's latest
    collectives, so without it each rank was compared with every other stage."""
    if engine.__dict__.get(DESCRIBED):
        return
    engine.__dict__[DESCRIBED] = True
    stage = integer(getattr(engine, "stage_id", None))
    rt.emit(
        PIPELINE,
        schedule="TrainSchedule",  # what train_batch() runs (DeepSpeed's 1F1B)
        microbatches=integer(getattr(engine, "micro_batches", None)),
        num_stages=integer(getattr(engine, "num_stages", None)),
        stages=[] if stage is None else [stage],
        site=None,
        stage_site=None,
    )


def on_pipe_batch(rt: core.Runtime, engine: Any, training: bool) -> None:
    describe_pipeline(rt, engine)
    if not training:
        if rt.auto_phase and rt.phase != core.AUTO_EVAL:
            rt.set_phase(core.AUTO_EVAL, auto=True)
        rt.steps.on_batch(rt.mono_clock(), False, None)
        return
    if rt.auto_phase and rt.phase != core.AUTO_TRAIN:
        rt.set_phase(core.AUTO_TRAIN, auto=True)
    micro, count = getattr(engine, "train_micro_batch_size_per_gpu", None), engine.micro_batches
    samples = micro() * count if callable(micro) and isinstance(count, int) else None
    rt.steps.on_batch(rt.mono_clock(), True, samples)


def wrap_pipe_batch(runtime: core.Runtime, cls: Any, name: str, training: bool) -> None:
    original = vars(cls).get(name)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = core._active
        if rt is None or self.__dict__.get(IN_BATCH):
            return original(self, *args, **kwargs)
        try:
            on_pipe_batch(rt, self, training)
        except Exception:  # noqa: BLE001 - recording must never break training
            pass
        self.__dict__[IN_BATCH] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            self.__dict__[IN_BATCH] = False
            rt.steps.on_batch_end()

    patch(runtime, cls, name, batch, original)


def install(runtime: core.Runtime) -> None:
    """Wrap the engines once the script imports DeepSpeed's (now, if it has)."""

    def imported(module: Any) -> None:
        cls = getattr(module, "DeepSpeedEngine", None)
        if cls is not None and core.active() is runtime:
            wrap_engine(runtime, cls)

    def pipe_imported(module: Any) -> None:
        cls = getattr(module, "PipelineEngine", None)
        if cls is not None and core.active() is runtime:
            wrap_pipe_batch(runtime, cls, "train_batch", True)
            wrap_pipe_batch(runtime, cls, "eval_batch", False)

    when_imported("deepspeed.runtime.engine", imported)
    when_imported("deepspeed.runtime.pipe.engine", pipe_imported)
