"""PyTorch's functional collectives: what DTensor, tensor parallelism and `full_tensor()` issue.

`torch.distributed._functional_collectives` runs a collective as a dispatcher op and returns an
AsyncCollectiveTensor that waits (`wait_tensor`) at its first use. Its functions are replaced in
the module (DTensor and tensor parallelism call them through it: `funcol.all_reduce(...)`), and
each call is recorded as torch.distributed's are (c10d_hooks.py): numbered in its process group
(the mesh dimension's group, the same numbers as the group's other collectives), with the
user's line. It ends when the result is waited for (the module's `wait_tensor`, which the
AsyncCollectiveTensor calls), or when its result is dropped unwaited, or at once when torch
waited inside the call (tracing).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from ddpdoctor.runtime import call_sites, core
from ddpdoctor.runtime.c10d_hooks import GROUPS, NESTING, OpSpec, bind
from ddpdoctor.runtime.collectives import TensorSummary, summarize
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch
from ddpdoctor.runtime.records import CollectiveDesc

# The functions recorded; each takes its input tensor(s) first and `group` and `tag` by name.
OPS = (
    "all_reduce",
    "broadcast",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_single",
    "all_gather_single_autograd",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_single",
    "reduce_scatter_single_autograd",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
)
# recorded under the name torch.distributed gives the same collective (the mismatch rule
# compares shapes of the ops whose tensors agree across ranks)
OP_NAMES = {
    "all_gather_tensor_autograd": "all_gather_tensor",
    "all_gather_single_autograd": "all_gather_single",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_single_autograd": "reduce_scatter_single",
    "all_to_all_single_autograd": "all_to_all_single",
}
# Collectives waiting for their wait_tensor: id of the result's inner tensor -> the record.
_PENDING: dict[int, Any] = {}
MAX_PENDING = 4096
_DESCRIPTIONS: dict[Any, CollectiveDesc | None] = {}
MAX_DESCRIPTIONS = 512


def _group_key(group: Any) -> Any:
    if isinstance(group, tuple) and len(group) == 2:
        return (id(group[0]), group[1])
    if isinstance(group, list):
        return tuple(group) if all(isinstance(g, int) for g in group) else id(group)
    if isinstance(group, str):
        return group
    return id(group)


def _process_group(funcol: Any, group: Any, tag: str) -> Any:
    resolved = funcol._resolve_group(group, tag)
    if isinstance(resolved, str):
        from torch.distributed import distributed_c10d as c10d

        return c10d._resolve_process_group(c10d.GroupName(resolved))
    return resolved


def describe(funcol: Any, name: str, value: Any, group: Any, tag: str) -> CollectiveDesc | None:
    tensors = value if isinstance(value, list | tuple) else [value]
    first = tensors[0] if tensors else None
    key: Any = (name, _group_key(group), len(tensors))
    if first is not None and hasattr(first, "shape"):
        key = (*key, *first.shape, first.dtype, first.is_cuda)
    known = _DESCRIPTIONS.get(key, False)
    if known is not False and len(tensors) <= 1:
        return known  # type: ignore[return-value]
    info = GROUPS.describe(_process_group(funcol, group, tag))
    desc = None
    if info is not None:
        summary = summarize(tensors) if first is not None else TensorSummary()
        desc = CollectiveDesc(OP_NAMES.get(name, name), info, summary, is_async=True)
    if len(_DESCRIPTIONS) >= MAX_DESCRIPTIONS:
        _DESCRIPTIONS.clear()
    _DESCRIPTIONS[key] = desc
    return desc


def _finish(rec: Any, tracker: Any, key: int) -> None:
    _PENDING.pop(key, None)
    tracker.end(rec, via="wait")


def wrap(funcol: Any, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    bound = bind(OpSpec(name, "self"), func)
    act_type = funcol.AsyncCollectiveTensor

    @functools.wraps(func)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        runtime = core._active
        if runtime is None or NESTING.depth:
            return func(*args, **kwargs)
        try:
            value = args[0] if args else kwargs.get("self")
            group = bound.arg("group", args, kwargs)
            desc = describe(funcol, name, value, group, bound.arg("tag", args, kwargs) or "")
        except Exception:  # noqa: BLE001 - describing must never stop the call itself
            desc = None
        if desc is None:
            return func(*args, **kwargs)
        tracker = runtime.collectives
        unit = NESTING.unit
        rec = tracker.begin(desc, unit if unit is not None else call_sites.caller_site(1))
        NESTING.depth += 1
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            NESTING.depth -= 1
        try:
            _watch(result, rec, tracker, act_type)
        except Exception:  # noqa: BLE001
            tracker.end(rec, via="return")
        return result

    setattr(recorded, WRAPPED_MARK, func)
    return recorded


def _watch(result: Any, rec: Any, tracker: Any, act_type: Any) -> None:
    """End `rec` at the wait for `result` (or when its tensor goes unwaited); at once when
    torch already waited (a plain tensor came back)."""
    results = result if isinstance(result, list | tuple) else [result]
    inner = [r.elem for r in results if isinstance(r, act_type)]
    if not inner:
        tracker.end(rec, via="return")
        return
    if len(_PENDING) >= MAX_PENDING:
        _PENDING.clear()
    elem = inner[-1]  # the last of a coalesced call's results: waited for after the others
    key = id(elem)
    _PENDING[key] = rec
    weakref.finalize(elem, _finish, rec, tracker, key)


def wrap_wait(wait: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(wait)
    def wait_tensor(tensor: Any) -> Any:
        rec = _PENDING.pop(id(tensor), None) if _PENDING else None
        out = wait(tensor)
        if rec is not None:
            rt = core._active
            if rt is not None:
                rt.collectives.end(rec, via="wait")
        return out

    setattr(wait_tensor, WRAPPED_MARK, wait)
    return wait_tensor


def install(runtime: core.Runtime) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed._functional_collectives as funcol

    for name in OPS:
        original = vars(funcol).get(name)
        if original is None or hasattr(original, WRAPPED_MARK):
            continue
        patch(runtime, funcol, name, wrap(funcol, name, original), original)
    wait = vars(funcol).get("wait_tensor")
    if wait is not None and not hasattr(wait, WRAPPED_MARK):
        patch(runtime, funcol, "wait_tensor", wrap_wait(wait), wait)
