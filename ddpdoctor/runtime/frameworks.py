"""Epochs and phases as the training frameworks know them, with no change to the user's code.

Steps need nothing framework-specific (a synced DDP forward confirmed by an optimizer step:
steps.py, optim_hooks.py). What only the framework knows is where the job is:

- Lightning (`lightning.pytorch`, or the older `pytorch_lightning`): every callback hook goes
  through one module function, `trainer.call._call_callback_hooks(trainer, hook_name, ...)`; its
  wrapper reads the hooks below and the trainer's state, and names the phases "sanity_check",
  "train", "validate", "test", "predict" and the epoch (`trainer.current_epoch`). The wrapper is
  put in place when the rank starts recording (inside `trainer.fit`, where Lightning joins the
  process group), so the same works for `ddp`, `ddp_spawn` and a Trainer under torchrun. With
  Lightning's phases the rank's phases are the framework's (ddpdoctor's own guesses from the
  forwards stop, as when a script names a phase).
- The HF Trainer: `CallbackHandler.call_event` is wrapped; "on_epoch_begin" sets the epoch from
  `state.epoch`, "on_step_begin" puts the rank in "train" and "on_prediction_step" (an
  evaluation batch) in "eval": ddpdoctor's own phase names, as guesses it makes itself (a
  script's `ddpdoctor.phase` still takes over).
- accelerate: nothing to add; its DataLoaderShard iterates a torch DataLoader, whose epochs the
  data hooks record, and its AcceleratedOptimizer steps a torch optimizer.

Each wrapper costs one dict lookup per framework hook call when the hook is not one of these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ddpdoctor.runtime import core, lightning_metrics
from ddpdoctor.runtime.import_hooks import when_imported
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning")

# Lightning's callback hooks that move the rank into a phase.
LIGHTNING_PHASES = {
    "on_sanity_check_start": "sanity_check",
    "on_train_epoch_start": "train",
    "on_train_batch_start": "train",  # back from a validation in the middle of an epoch
    "on_validation_start": "validate",
    "on_test_start": "test",
    "on_predict_start": "predict",
}


def on_lightning_hook(rt: core.Runtime, trainer: Any, hook_name: str) -> None:
    """One of LIGHTNING_PHASES' hooks is about to run."""
    phase = LIGHTNING_PHASES[hook_name]
    if hook_name == "on_validation_start" and getattr(trainer, "sanity_checking", False):
        phase = "sanity_check"
    if hook_name == "on_train_epoch_start":
        epoch = getattr(trainer, "current_epoch", None)
        if isinstance(epoch, int):
            rt.steps.set_epoch(epoch)
    if rt.phase != phase:
        rt.set_phase(phase)


def wrap_lightning(package: Any, runtime: core.Runtime) -> None:
    """Wrap `<package>.trainer.call._call_callback_hooks` (once per process)."""
    import importlib

    call = importlib.import_module(f"{package.__name__}.trainer.call")
    original = getattr(call, "_call_callback_hooks", None)
    if original is None or hasattr(original, WRAPPED_MARK):
        return
    phases = LIGHTNING_PHASES

    @functools.wraps(original)
    def _call_callback_hooks(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        if hook_name in phases:
            rt = core._active
            if rt is not None:
                try:
                    on_lightning_hook(rt, trainer, hook_name)
                except Exception:  # noqa: BLE001 - recording must never break training
                    pass
        return original(trainer, hook_name, *args, **kwargs)

    patch(runtime, call, "_call_callback_hooks", _call_callback_hooks, original)


# The HF Trainer's callback events that say what the rank does. It evaluates the bare model (not
# its DDP wrapper), so no DDP forward would say "eval"; there is no event before an evaluation,
# so the phase turns "eval" after its first batch.
HF_PHASES = {"on_step_begin": "train", "on_prediction_step": "eval"}


def on_hf_event(rt: core.Runtime, event: str, state: Any) -> None:
    """One of the HF Trainer's callback events: on_epoch_begin sets the epoch from
    `state.epoch` (a float that reached the epoch's number at the last step of the epoch
    before); the phases are ddpdoctor's own names, set as its guesses are (`auto`)."""
    if event == "on_epoch_begin":
        epoch = getattr(state, "epoch", None)
        if isinstance(epoch, int | float):
            rt.steps.set_epoch(int(epoch + 1e-6))
        return
    phase = HF_PHASES[event]
    if rt.auto_phase and rt.phase != phase:
        rt.set_phase(phase, auto=True)


def wrap_hf_trainer(module: Any, runtime: core.Runtime) -> None:
    """Wrap `transformers.trainer_callback.CallbackHandler.call_event` (once per process)."""
    handler = getattr(module, "CallbackHandler", None)
    original = getattr(handler, "call_event", None)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    watched = {"on_epoch_begin", *HF_PHASES}

    @functools.wraps(original)
    def call_event(self: Any, event: str, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        if event in watched:
            rt = core._active
            if rt is not None:
                try:
                    on_hf_event(rt, event, state)
                except Exception:  # noqa: BLE001
                    pass
        return original(self, event, args, state, control, **kw)

    patch(runtime, handler, "call_event", call_event, original)


def _wrap_lightning_all(package: Any, runtime: core.Runtime) -> None:
    wrap_lightning(package, runtime)
    lightning_metrics.wrap(package, runtime)  # the user's line behind metrics synced later


def install(runtime: core.Runtime) -> None:
    """Wrap each framework now if it is imported, else when it is (a post-import hook; the
    wrappers are taken out again with `runtime`)."""

    def later(wrap: Callable[[Any, core.Runtime], None]) -> Callable[[Any], None]:
        def apply(module: Any) -> None:
            current = core.active()  # the runtime recording when the framework is imported
            if current is not None:
                wrap(module, current)

        return apply

    for package in LIGHTNING_PACKAGES:
        when_imported(package, later(_wrap_lightning_all))
    when_imported("transformers.trainer_callback", later(wrap_hf_trainer))
