"""Calls that change a replica's parameters outside DDP's averaged optimizer step.

DDP keeps its replicas identical only as long as every rank applies the same update to the same
parameters. What breaks that is a call some ranks make and others do not: a `load_state_dict`
into the DDP model (or its module, or the optimizer) on rank 0 alone, an LR scheduler stepped
under `if rank == 0`, an optimizer step skipped on one rank. None of these is a collective, so
nothing else records them. This module counts them per (what, the user's line) in the rank's
process, with the steps of the first and last call; the counts travel with the replica digests
(replicas.py), and the watcher cites the call whose count differs between the ranks whose
digests differ (monitor/judge/rules/replicas.py).

Cost: a `load_state_dict` is rare, a scheduler step is once per step or epoch and costs a stack
walk to the user's frame (call_sites.py: cached per site, a few µs). The optimizer step is counted
in the optimizer's global post-hook (optim_hooks.py) with one dict look-up; its site is found once
per optimizer class. Nested calls (a `load_state_dict` override that calls its parent's, a
SequentialLR stepping its children) count once, at the outermost call.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

from ddpdoctor.runtime import core
from ddpdoctor.runtime.call_sites import caller_site
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

MAX_KEYS = 64  # distinct (what, site) counted per rank; more is a loop of generated code
MAX_STEPS = 8  # steps listed per key (the first ones): enough to say "at step 20"
# Marked on a DDP model's module at its first training forward (replicas.py), so a
# `load_state_dict` into the module itself is told from one into an unrelated model.
MODULE_MARK = "_ddpdoctor_ddp_module"


class CallCount:
    """One (what, site) and how often this rank called it (mutable)."""

    __slots__ = ("count", "ddp", "site", "steps", "what")

    def __init__(self, what: str, site: dict[str, Any] | None, ddp: bool) -> None:
        self.what = what
        self.site = site
        self.ddp = ddp  # it wrote into a DDP model (its own parameters), not elsewhere
        self.count = 0
        self.steps: list[int] = []

    def as_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "site": self.site,
            "ddp": self.ddp,
            "count": self.count,
            "steps": list(self.steps),
        }


_COUNTS: dict[tuple[str, str | None], CallCount] = {}
_OPTIMIZERS: dict[type, CallCount] = {}
_DEPTH = threading.local()


def snapshot() -> list[dict[str, Any]]:
    """Every call counted so far, for a digest event."""
    return [c.as_json() for c in list(_COUNTS.values())]


def forget() -> None:
    _COUNTS.clear()
    _OPTIMIZERS.clear()


def _site(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads("{" + text + "}").get("site")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _step(rt: core.Runtime) -> int:
    """The step in progress (1 for the first), or the last one between steps: a write at step
    20 is seen first by the digest of step 20 or later (taken after 20 steps finished)."""
    return rt.steps.current


def count(what: str, site_text: str | None, *, ddp: bool, rt: core.Runtime) -> None:
    key = (what, site_text)
    entry = _COUNTS.get(key)
    if entry is None:
        if len(_COUNTS) >= MAX_KEYS:
            return
        entry = _COUNTS[key] = CallCount(what, _site(site_text), ddp)
    entry.count += 1
    if len(entry.steps) < MAX_STEPS:
        entry.steps.append(_step(rt))


def on_optimizer_step(optimizer: Any, rt: core.Runtime) -> None:
    """From optim_hooks' global post-hook: one more step of this optimizer's class."""
    entry = _OPTIMIZERS.get(type(optimizer))
    if entry is None:
        what = f"{type(optimizer).__name__}.step"
        entry = CallCount(what, _site(caller_site(2)), True)
        if len(_COUNTS) >= MAX_KEYS:
            return
        _OPTIMIZERS[type(optimizer)] = _COUNTS[(what, "optimizer")] = entry
    entry.count += 1
    if len(entry.steps) < MAX_STEPS:
        entry.steps.append(_step(rt))


def _is_ddp_target(obj: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return isinstance(obj, DDP) or bool(getattr(obj, "__dict__", {}).get(MODULE_MARK))


def _wrap(owner: Any, name: str, what_of: Any, rt: core.Runtime) -> None:
    original = getattr(owner, name, None)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = core._active
        depth = getattr(_DEPTH, "n", 0)
        if runtime is not None and depth == 0:
            try:
                what, ddp = what_of(self)
                count(what, caller_site(1), ddp=ddp, rt=runtime)
            except Exception:  # noqa: BLE001 - counting must never break the call
                pass
        _DEPTH.n = depth + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _DEPTH.n = depth

    patch(rt, owner, name, wrapper, original)


def _module_load(module: Any) -> tuple[str, bool]:
    return f"{type(module).__name__}.load_state_dict", _is_ddp_target(module)


def _optimizer_load(optimizer: Any) -> tuple[str, bool]:
    return f"{type(optimizer).__name__}.load_state_dict", True


def _scheduler_step(scheduler: Any) -> tuple[str, bool]:
    return f"{type(scheduler).__name__}.step", True


def install(runtime: core.Runtime) -> None:
    import torch
    from torch.optim import lr_scheduler

    _wrap(torch.nn.Module, "load_state_dict", _module_load, runtime)
    _wrap(torch.optim.Optimizer, "load_state_dict", _optimizer_load, runtime)
    seen: set[Any] = set()
    for name in ("LRScheduler", "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler"):
        cls = getattr(lr_scheduler, name, None)
        if cls is None or "step" not in vars(cls) or vars(cls)["step"] in seen:
            continue
        seen.add(vars(cls)["step"])
        _wrap(cls, "step", _scheduler_step, runtime)
    runtime.on_deactivate(forget)
