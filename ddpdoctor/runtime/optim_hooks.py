"""Optimizer steps: what confirms that a DDP forward trained (steps.py).

Every `torch.optim.Optimizer.step` runs torch's global step hooks; ddpdoctor registers one "post"
hook there. Lightning, accelerate (its AcceleratedOptimizer steps the torch optimizer it wraps), the
HF Trainer and plain loops all go through it, so a step is counted however the framework drives
the DDP module: Lightning, for one, runs its training forward inside `optimizer.step(closure)`
with the DDP wrapper left in eval mode. The hook runs once per optimizer step and only marks the
open step trained (and, until a script or framework names phases, puts the rank in "train").
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.runtime import core, replica_calls
from ddpdoctor.runtime.replicas import NEVER


def on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global optimizer step post-hook (returns None: the optimizer's result stands)."""
    rt = core._active
    if rt is None:
        return
    try:
        if rt.auto_phase and rt.phase != core.AUTO_TRAIN:
            # before the step is marked: the phase change closes only finished steps
            rt.set_phase(core.AUTO_TRAIN, auto=True)
        rt.steps.on_optimizer_step()
        if rt.replica_next != NEVER:  # replica digests on: count it for their citations
            replica_calls.on_optimizer_step(optimizer, rt)
    except Exception:  # noqa: BLE001 - recording must never break the optimizer
        pass


def install(runtime: core.Runtime) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(on_optimizer_step)
    runtime.on_deactivate(handle.remove)
