"""Record every torch.distributed collective and point-to-point call.

The functions are replaced where user code and torch's own Python code look them up: the
attributes of `torch.distributed` and of `torch.distributed.distributed_c10d` (whose own functions
call each other through its module globals). Only the outermost call is recorded: a thread-local
depth counter lets the all_gather inside all_gather_object, or the all_reduce inside a DDP comm
hook, through unrecorded, so a rank numbers its collectives the way every other rank does.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.protocol.events import DEFAULT_GROUP, WARNING
from ddpdoctor.runtime import call_sites, completion, core
from ddpdoctor.runtime.call_args import batch_parts, global_rank, tensors_of
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary, summarize
from ddpdoctor.runtime.patching import WRAPPED_MARK
from ddpdoctor.runtime.records import CollectiveDesc


@dataclass(frozen=True)
class OpSpec:
    """How to read one torch.distributed function's arguments."""

    name: str
    tensors: str | None = None  # the parameter with the tensor(s) this rank contributes
    p2p: bool = False
    peers: tuple[str, ...] = ()  # parameters naming the peer rank (global first)
    always_async: bool = False


# The communication functions of torch 2.14's torch.distributed (others are skipped when absent).
OP_SPECS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", "tensor"),
    OpSpec("all_reduce_coalesced", "tensors"),
    OpSpec("all_gather", "tensor"),
    OpSpec("all_gather_coalesced", "input_tensor_list"),
    OpSpec("all_gather_into_tensor", "input_tensor"),
    OpSpec("all_gather_single", "input_tensor"),
    OpSpec("_all_gather_base", "input_tensor"),
    OpSpec("all_gather_object"),
    OpSpec("all_to_all", "input_tensor_list"),
    OpSpec("all_to_all_single", "input"),
    OpSpec("barrier"),
    OpSpec("monitored_barrier"),
    OpSpec("broadcast", "tensor"),
    OpSpec("broadcast_object_list"),
    OpSpec("gather", "tensor"),
    OpSpec("gather_into_tensor", "tensor"),
    OpSpec("gather_single", "tensor"),
    OpSpec("gather_object"),
    OpSpec("reduce", "tensor"),
    OpSpec("reduce_scatter", "output"),
    OpSpec("reduce_scatter_tensor", "input"),
    OpSpec("reduce_scatter_single", "input"),
    OpSpec("_reduce_scatter_base", "input"),
    OpSpec("scatter", "tensor"),
    OpSpec("scatter_object_list"),
    OpSpec("send", "tensor", p2p=True, peers=("dst", "group_dst")),
    OpSpec("recv", "tensor", p2p=True, peers=("src", "group_src")),
    OpSpec("isend", "tensor", p2p=True, peers=("dst", "group_dst"), always_async=True),
    OpSpec("irecv", "tensor", p2p=True, peers=("src", "group_src"), always_async=True),
    OpSpec("send_object_list", p2p=True, peers=("dst", "group_dst")),
    OpSpec("recv_object_list", p2p=True, peers=("src", "group_src")),
    OpSpec("batch_isend_irecv", "p2p_op_list", p2p=True, always_async=True),
)


class _Nesting(threading.local):
    depth = 0
    # While a DDP comm hook runs: the Works its nested calls return (they tell when it is done).
    capture: list[Any] | None = None
    # While an FSDP unit gathers or reduces (fsdp_hooks.py): the site its collectives take, the
    # unit's own (its module and the line that called fully_shard), in place of a frame walk.
    unit: str | None = None


NESTING = _Nesting()


@dataclass(frozen=True)
class BoundOp:
    """An OpSpec with the positions of its parameters in the real function's signature."""

    spec: OpSpec
    positions: dict[str, int] = field(default_factory=dict)

    def arg(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        pos = self.positions.get(name)
        if pos is not None and pos < len(args):
            return args[pos]
        return None


def bind(spec: OpSpec, func: Callable[..., Any]) -> BoundOp:
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        names = []
    return BoundOp(spec, {name: i for i, name in enumerate(names)})


class GroupNames:
    """Process group -> GroupInfo, cached (a group's name, size and members never change)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, GroupInfo]] = {}
        self._c10d: Any = None

    def describe(self, group: Any) -> GroupInfo | None:
        """None when this rank is not a member (torch then returns without communicating) or when
        there is no process group yet (torch raises, and the call is not a collective)."""
        c10d = self._c10d
        if c10d is None:
            from torch.distributed import distributed_c10d as c10d

            self._c10d = c10d
        world = c10d.GroupMember.WORLD
        if group is None:
            group = world
        if group is None:
            return None
        if group is not world and not hasattr(group, "size"):
            return None  # GroupMember.NON_GROUP_MEMBER: torch returns at once
        cached = self._cache.get(id(group))
        if cached is not None and cached[0] is group:
            return cached[1]
        try:
            size = int(group.size())
        except Exception:  # noqa: BLE001 - a backend object without size()
            size = None
        if group is world:
            info = GroupInfo(DEFAULT_GROUP, size, None)
        else:
            try:
                ranks: tuple[int, ...] | None = tuple(c10d.get_process_group_ranks(group))
            except Exception:  # noqa: BLE001
                ranks = None
            info = GroupInfo(str(getattr(group, "group_name", None) or id(group)), size, ranks)
        self._cache[id(group)] = (group, info)  # holding the group keeps its id from being reused
        return info


GROUPS = GroupNames()


def wrap(func: Callable[..., Any], bound: BoundOp) -> Callable[..., Any]:

    @functools.wraps(func)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        runtime = core._active
        if runtime is None or NESTING.depth:
            result = func(*args, **kwargs)
            if NESTING.capture is not None and result is not None:
                NESTING.capture.append(result)
            return result
        try:
            desc = describe_call(bound, args, kwargs)
        except Exception:  # noqa: BLE001 - describing must never stop the call itself
            desc = None
        if desc is None:
            return func(*args, **kwargs)
        tracker = runtime.collectives
        # written before the call is entered: a rank that dies in it (gloo aborts the process on
        # a size mismatch) has said what it was calling, with which shapes
        unit = NESTING.unit
        rec = tracker.begin(desc, unit if unit is not None else call_sites.caller_site(1))
        NESTING.depth += 1
        t0 = runtime.mono_clock()
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            NESTING.depth -= 1
        try:
            if desc.is_async:
                completion.finish_async(tracker, rec, result, on_gpu=desc.on_gpu)
            else:
                if threading.get_ident() == threading.main_thread().ident:
                    runtime.steps.on_comm_wait(runtime.mono_clock() - t0)
                if desc.on_gpu:
                    completion.finish_blocking(
                        tracker, rec, on_gpu=True, cuda_marker=runtime.cuda_marker
                    )
                else:
                    tracker.end(rec)  # a blocking CPU op is over when it returns
        except Exception:  # noqa: BLE001
            tracker.end(rec, via="return")
        return result

    setattr(recorded, WRAPPED_MARK, func)
    return recorded


# Descriptions of the calls made so far, by what tells them apart: op, group object, the tensor's
# shape, dtype and device type, async, peer. A loop makes the same few calls again and again; a hit
# costs a dict lookup instead of describing the group and the tensors anew.
_CALLS: dict[Any, CollectiveDesc] = {}
MAX_CALLS = 512


def forget_calls() -> None:
    """Process groups come and go (destroy, init again): describe every call afresh."""
    _CALLS.clear()


def describe_call(
    bound: BoundOp, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> CollectiveDesc | None:
    """How the events describe this call; None when it is no collective for this rank."""
    spec = bound.spec
    if spec.name == "batch_isend_irecv":
        ops = bound.arg("p2p_op_list", args, kwargs) or []
        group = GROUPS.describe(getattr(ops[0], "group", None) if ops else None)
        if group is None:
            return None
        tensors = summarize(tensors_of(ops))
        parts = batch_parts(ops)
        peers = tuple(sorted({peer for _, peer, _ in parts}))
        return CollectiveDesc(
            spec.name,
            group,
            tensors,
            is_async=True,
            p2p=True,
            peer=peers[0] if len(peers) == 1 else None,
            parts=parts,
        )
    group_arg = bound.arg("group", args, kwargs)
    value = bound.arg(spec.tensors, args, kwargs) if spec.tensors else None
    is_async = spec.always_async or bool(bound.arg("async_op", args, kwargs))
    peer = None
    group_peer = False  # a group_dst / group_src: a rank of the group, made global below
    for name in spec.peers:
        given = bound.arg(name, args, kwargs)
        if given is not None:
            peer = int(given)
            group_peer = name.startswith("group_")
            break
    tag = bound.arg("tag", args, kwargs) if spec.p2p else None
    if tag is not None:
        peer_key: Any = (peer, group_peer, tag)
    else:
        peer_key = (peer, group_peer) if group_peer else peer
    key: Any = None
    if value is None:
        key = (spec.name, group_arg, None, is_async, peer_key)
    elif hasattr(value, "shape") and hasattr(value, "dtype"):  # one tensor: the common case
        key = (spec.name, group_arg, (*value.shape, value.dtype, value.is_cuda), is_async, peer_key)
    if key is not None:
        try:
            desc = _CALLS.get(key)
        except TypeError:  # an unhashable stand-in for a group
            desc, key = None, None
        if desc is not None:
            return desc
    group = GROUPS.describe(group_arg)
    if group is None:
        return None
    tensors = summarize(tensors_of(value)) if spec.tensors else TensorSummary()
    if group_peer and peer is not None:
        peer = global_rank(group, peer)
    desc = CollectiveDesc(
        spec.name, group, tensors, is_async=is_async, p2p=spec.p2p, peer=peer, tag=tag
    )
    if key is not None:
        if len(_CALLS) >= MAX_CALLS:
            _CALLS.clear()
        _CALLS[key] = desc
    return desc


def install(runtime: core.Runtime) -> None:
    """Wrap every communication function of torch.distributed (once; undone by deactivate)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    for spec in OP_SPECS:
        original = getattr(c10d, spec.name, None)
        if original is None or hasattr(original, WRAPPED_MARK):
            continue
        recorded = wrap(original, bind(spec, original))
        _replace(runtime, c10d, spec.name, original, recorded)
        if getattr(dist, spec.name, None) is original:
            _replace(runtime, dist, spec.name, original, recorded)
    _wrap_lifecycle(runtime, dist, c10d)
    _accept_unwrapped_p2p_ops(runtime, c10d)


def _accept_unwrapped_p2p_ops(runtime: core.Runtime, c10d: Any) -> None:
    """P2POp(op, ...) insists that op *is* torch.distributed.isend or irecv. Code that took the
    function before the runtime was activated holds the unwrapped one: map it to the wrapper."""
    check_op = getattr(c10d, "_check_op", None)
    p2p_op = getattr(c10d, "P2POp", None)
    if check_op is None or p2p_op is None or hasattr(check_op, WRAPPED_MARK):
        return

    def canonical(op: Any) -> Any:
        for name in ("isend", "irecv"):
            current = getattr(c10d, name, None)
            if op is getattr(current, WRAPPED_MARK, None):
                return current
        return op

    @functools.wraps(check_op)
    def _check_op(op: Any) -> None:
        return check_op(canonical(op))

    setattr(_check_op, WRAPPED_MARK, check_op)
    _replace(runtime, c10d, "_check_op", check_op, _check_op)

    original_init = p2p_op.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, canonical(op), *args, **kwargs)

    p2p_op.__init__ = __init__

    def undo() -> None:
        if p2p_op.__dict__.get("__init__") is __init__:
            p2p_op.__init__ = original_init

    runtime.on_deactivate(undo)


def _replace(runtime: core.Runtime, module: Any, name: str, original: Any, new: Any) -> None:
    setattr(module, name, new)

    def undo() -> None:
        if getattr(module, name, None) is new:
            setattr(module, name, original)

    runtime.on_deactivate(undo)


WORLD_SIZE_ARG = 3  # init_process_group(backend, init_method, timeout, world_size, rank, ...)


def _note_world_size(runtime: core.Runtime | None, args: tuple, kwargs: dict[str, Any]) -> None:
    """Record a world size the script asks for that the launch cannot fill, BEFORE init blocks
    on it for good (the monitor's world-size rule reads it): world_size=3 under 2 ranks."""
    if runtime is None:
        return
    asked = kwargs.get("world_size", args[WORLD_SIZE_ARG] if len(args) > WORLD_SIZE_ARG else -1)
    try:
        asked, launched = int(asked), int(os.environ.get("WORLD_SIZE", ""))
    except (TypeError, ValueError):
        return
    if asked > 0 and asked != launched:
        runtime.emit(
            WARNING,
            code="init.world_size_mismatch",
            message=f"init_process_group(world_size={asked}) but the launcher started "
            f"{launched} ranks (WORLD_SIZE={launched})",
            requested_world_size=asked,
            world_size=launched,
        )


def _wrap_lifecycle(runtime: core.Runtime, dist: Any, c10d: Any) -> None:
    """init_process_group tells the rank, backend and device; destroy ends the last step."""
    init = c10d.init_process_group
    destroy = c10d.destroy_process_group
    if not hasattr(init, WRAPPED_MARK):
        signature = _signature(init)

        @functools.wraps(init)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            forget_calls()
            _note_world_size(core.active(), args, kwargs)
            result = init(*args, **kwargs)
            current = core.active()
            if current is not None:
                current.pg_timeout_s, current.pg_timeout_given = pg_timeout_s(
                    c10d, signature, args, kwargs
                )
                current.on_process_group()
            return result

        setattr(init_process_group, WRAPPED_MARK, init)
        for module in (c10d, dist):
            if getattr(module, "init_process_group", None) is init:
                _replace(runtime, module, "init_process_group", init, init_process_group)
    if not hasattr(destroy, WRAPPED_MARK):

        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            current = core.active()
            if current is not None:
                current.steps.flush()
                if not args and kwargs.get("group") is None:  # the default group: the end
                    current.run_at_end()
            forget_calls()
            return destroy(*args, **kwargs)

        setattr(destroy_process_group, WRAPPED_MARK, destroy)
        for module in (c10d, dist):
            if getattr(module, "destroy_process_group", None) is destroy:
                _replace(runtime, module, "destroy_process_group", destroy, destroy_process_group)


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def pg_timeout_s(
    c10d: Any, signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[float | None, bool]:
    """(seconds, whether the script gave it) of the default process group's timeout: `timeout=`
    as given, else torch's default for its backend (NCCL 10 min, gloo 30 min). A waiting rank
    fails when it runs out, so a watcher counts down to it (None when it cannot be told)."""
    try:
        given = signature.bind_partial(*args, **kwargs).arguments if signature else kwargs
        timeout = given.get("timeout")
        if timeout is not None:
            return float(timeout.total_seconds()), True
        backend = str(c10d.get_backend())
        default = getattr(c10d, "_get_default_timeout", None)
        if default is not None:
            return float(default(backend).total_seconds()), False
    except Exception:  # noqa: BLE001 - a fact the watcher can do without
        return None, False
    return None, False
