"""torchft: a process is a rank when it builds a `torchft.Manager`; torchft's collectives and
its quorums are recorded.

torchft never calls `init_process_group`: each replica group is its own torchrun, the Manager
connects to that torchrun's store, and its process group (ProcessGroupGloo, ProcessGroupBaby*,
the DDP wrapper's ManagedProcessGroup) is configured anew by every quorum the lighthouse forms.
So, in every process of a job (autostart.py installs this before any code of the job runs):

- `Manager.__init__` starts the runtime like `init_process_group` does, and the rank is
  torchft's own global rank: `replica group index x group world size + group rank`, the index
  being the trailing digits of the `replica_id` the script gives (torchft's convention), else
  $REPLICA_GROUP_ID (its README's), else 0. The hello event carries `torchft`: the replica
  group, its id, the rank in the group and the group's size.
- The collectives of torchft's process groups are recorded like torch.distributed's: numbered
  in the group of one quorum (`torchft:q<quorum id>:g<group rank>`; its members are the global
  ranks in the quorum), the user's line as the site.
- The quorums: a `torchft` event (`what: "quorum"`) when the quorum id changes or this rank
  heals or sends a checkpoint (never per step): the quorum id, the replica groups in it, the ones
  that left and joined since the last one this rank saw, and whether this rank heals from a
  peer (`heal_from`). `what: "healed"` once the peer's state is loaded.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.replica_groups import (
    GROUP_PREFIX,
    HEALED,
    QUORUM,
    TORCHFT,
    group_index,
)
from ddpdoctor.runtime import c10d_hooks, call_sites, completion, core
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary, summarize
from ddpdoctor.runtime.patching import WRAPPED_MARK
from ddpdoctor.runtime.records import CollectiveDesc

# The methods of torchft's process groups that communicate, and where their tensors are.
PG_OPS = {
    "allreduce": 0,
    "allreduce_coalesced": 0,
    "allgather": 1,
    "allgather_into_tensor_coalesced": 1,
    "broadcast": 0,
    "barrier": None,
    "reduce_scatter": 1,
    "reduce_scatter_tensor_coalesced": 1,
    "alltoall_base": 1,
}
# torch.distributed's names for the same ops (the rules compare ops by name across ranks)
OP_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall_base": "all_to_all_single",
}
MAX_IDS = 64  # replica ids said per quorum event (a quorum of thousands is said in part)


# -- the rank: Manager.__init__ ----------------------------------------------------------------


def global_rank(replica_id: Any, group_rank: int, group_world_size: int) -> tuple[int, int]:
    """(replica group index, global rank) as torchft numbers them."""
    index = group_index(replica_id if isinstance(replica_id, str) else None)
    if index is None:
        env = os.environ.get("REPLICA_GROUP_ID", "")
        index = int(env) if env.isdigit() else 0
    return index, index * max(group_world_size, 1) + group_rank


def _start_alone() -> core.Runtime | None:
    from ddpdoctor.runtime import activation

    return activation.start(join_only=True)


def wrap_manager(
    module: Any,
    start: Callable[[], core.Runtime | None] = _start_alone,
    on_join: Callable[[], None] = lambda: None,
) -> None:
    """Make `Manager.__init__` the moment the process becomes a rank. `start`: how the runtime
    starts (autostart's, which knows the script); `on_join`: told once the rank is known."""
    manager_cls = getattr(module, "Manager", None)
    original = getattr(manager_cls, "__init__", None)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        runtime = core.active() or start()
        original(self, *args, **kwargs)
        if runtime is not None and core.active() is runtime:
            try:
                _joined(runtime, self)
                on_join()
            except Exception:  # noqa: BLE001 - recording must never break training
                pass

    setattr(__init__, WRAPPED_MARK, original)
    setattr(manager_cls, "__init__", __init__)  # noqa: B010 - mypy will not let a class be assigned its __init__
    for name, wrapper in (
        ("_apply_pending_state_dict", _wrap_healed),
        ("start_quorum", _wrap_start_quorum),
    ):
        method = getattr(manager_cls, name, None)
        if method is not None and not hasattr(method, WRAPPED_MARK):
            setattr(manager_cls, name, wrapper(method))


def _joined(runtime: core.Runtime, manager: Any) -> None:
    group_rank = int(manager._group_rank)
    group_size = int(manager._group_world_size)
    index, rank = global_rank(getattr(manager, "_replica_id", None), group_rank, group_size)
    # the world as far as this rank can tell: up to its own group (the quorums tell more)
    runtime.world_size = max(runtime.world_size or 0, (index + 1) * max(group_size, 1))
    if runtime.writer is None:
        runtime.set_rank(rank)
    pg = getattr(manager, "_pg", None)
    try:
        runtime.backend = str(pg.getBackendName()) if pg is not None else "torchft"
    except Exception:  # noqa: BLE001 - not configured before the first quorum
        runtime.backend = "torchft-" + type(pg).__name__
    runtime.hello_extra["torchft"] = {
        "replica_group": index,
        "replica_id": str(getattr(manager, "_replica_id", None) or "")[:200],
        "group_rank": group_rank,
        "group_world_size": group_size,
        "process_group": type(pg).__name__ if pg is not None else None,
    }
    runtime.say_hello()
    client = getattr(manager, "_client", None)
    if client is not None and not isinstance(client, _QuorumClient):
        manager._client = _QuorumClient(client, runtime, group_size, group_rank)


class _QuorumClient:
    """The Manager's client to its replica group's manager server, with each quorum recorded
    when it differs from the last one (a quorum is asked for every step)."""

    def __init__(self, client: Any, runtime: core.Runtime, group_size: int, group_rank: int):
        self._client = client
        self._runtime = runtime
        self._group_size = group_size
        self._group_rank = group_rank
        self._last_id: int | None = None
        self._last_groups: tuple[int, ...] = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        quorum = self._client._quorum(*args, **kwargs)
        try:
            self._record(quorum, kwargs.get("step"))
        except Exception:  # noqa: BLE001
            pass
        return quorum

    def _record(self, quorum: Any, step: Any) -> None:
        quorum_id = int(quorum.quorum_id)
        heal = bool(getattr(quorum, "heal", False))
        sends = list(getattr(quorum, "recover_dst_replica_ranks", None) or [])
        if quorum_id == self._last_id and not heal and not sends:
            return
        ids = [str(i) for i in (getattr(quorum, "replica_ids", None) or [])]
        groups = tuple(sorted({g for g in (group_index(i) for i in ids) if g is not None}))
        previous, self._last_groups = self._last_groups, groups
        first = self._last_id is None
        self._last_id = quorum_id
        runtime = core.active()
        if runtime is not self._runtime:
            return
        fields: dict[str, Any] = {
            "what": QUORUM,
            "quorum_id": quorum_id,
            "replica_rank": _int_or_none(getattr(quorum, "replica_rank", None)),
            "replica_world_size": _int_or_none(getattr(quorum, "replica_world_size", None)),
            "replica_groups": list(groups),
            "replica_ids": [i.split(":")[0][:100] for i in ids[:MAX_IDS]],
            "left": [] if first else [g for g in previous if g not in groups],
            "joined": [] if first else [g for g in groups if g not in previous],
            "step": _int_or_none(step),
            "max_step": _int_or_none(getattr(quorum, "max_step", None)),
        }
        if heal:
            src = _int_or_none(getattr(quorum, "recover_src_replica_rank", None))
            fields["heal_from"] = src
            fields["heal_from_group"] = _group_at(ids, src)
        if sends:
            fields["send_to"] = [_int_or_none(r) for r in sends[:MAX_IDS]]
        runtime.emit(TORCHFT, **fields)
        world = (max(groups, default=0) + 1) * max(self._group_size, 1)
        if world > (runtime.world_size or 0):  # a replica group beyond the known world
            runtime.world_size = world
            runtime.say_hello()


def _group_at(ids: list[str], replica_rank: int | None) -> int | None:
    """The replica group of the quorum's replica rank (replica ranks follow the ids' order)."""
    if replica_rank is None or not 0 <= replica_rank < len(ids):
        return None
    return group_index(ids[replica_rank])


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _wrap_healed(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def _apply_pending_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        runtime = core.active()
        if runtime is not None and getattr(self, "_pending_state_dict", 0) is None:
            runtime.emit(TORCHFT, what=HEALED, step=_int_or_none(self.current_step()))
        return result

    setattr(_apply_pending_state_dict, WRAPPED_MARK, method)
    return _apply_pending_state_dict


def _wrap_start_quorum(method: Callable[..., Any]) -> Callable[..., Any]:
    """torchft's step begins at its quorum (the Optimizer wrapper's zero_grad): a step for
    ddpdoctor too, confirmed by the optimizer's step when torchft commits it."""

    @functools.wraps(method)
    def start_quorum(self: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = core._active
        if runtime is not None:
            try:
                runtime.steps.on_iteration_start(runtime.mono_clock())
            except Exception:  # noqa: BLE001
                pass
        return method(self, *args, **kwargs)

    setattr(start_quorum, WRAPPED_MARK, method)
    return start_quorum


# -- the collectives of torchft's process groups ------------------------------------------------


def wrap_process_groups(module: Any) -> None:
    """Wrap the communicating methods of torchft's process group classes (once)."""
    for cls_name in ("ProcessGroupWrapper", "ProcessGroupBaby"):
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        for name, tensors_at in PG_OPS.items():
            method = vars(cls).get(name)
            if method is None or hasattr(method, WRAPPED_MARK):
                continue
            setattr(cls, name, _wrap_op(method, name, tensors_at))


def describe_group(pg: Any) -> GroupInfo | None:
    """The group of torchft's process group as configured by the last quorum (None before)."""
    quorum_id = getattr(pg, "_quorum_id", None)
    group_rank = getattr(pg, "_group_rank", None)
    ranks = getattr(pg, "_global_ranks", None)
    if quorum_id is None:
        return None
    try:
        size: int | None = int(pg.size())
    except Exception:  # noqa: BLE001 - not configured
        size = None
    members = tuple(int(r) for r in ranks) if ranks else None
    if members is not None and size is not None and len(members) != size:
        members = None  # torchft's numbering does not cover this group: say none
    name = f"{GROUP_PREFIX}q{quorum_id}:g{group_rank if group_rank is not None else 0}"
    return GroupInfo(name, size, members)


# Descriptions of the calls made so far: a training loop makes the same few (a DDP bucket per
# step) in one quorum's group again and again; a hit costs a dict lookup.
_CALLS: dict[Any, CollectiveDesc | None] = {}
MAX_CALLS = 256


def _describe(pg: Any, op: str, tensors: list[Any]) -> CollectiveDesc | None:
    first = tensors[0] if tensors else None
    key: Any = (id(pg), getattr(pg, "_quorum_id", None), op, len(tensors))
    if first is not None:
        key = (*key, *first.shape, first.dtype)
    if len(tensors) <= 1:
        known = _CALLS.get(key, False)
        if known is not False:
            return known  # type: ignore[return-value]
    group = describe_group(pg)
    desc = None
    if group is not None:
        summary = summarize(tensors) if tensors else TensorSummary()
        desc = CollectiveDesc(op, group, summary, is_async=True)
    if len(_CALLS) >= MAX_CALLS:
        _CALLS.clear()
    _CALLS[key] = desc
    return desc


def _wrap_op(method: Callable[..., Any], name: str, tensors_at: int | None) -> Callable[..., Any]:
    op = OP_NAMES.get(name, name)

    @functools.wraps(method)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = core._active
        nesting = c10d_hooks.NESTING
        if runtime is None or nesting.depth:
            return method(self, *args, **kwargs)
        try:
            value = args[tensors_at] if tensors_at is not None and len(args) > tensors_at else None
            tensors = c10d_hooks.tensors_of(value)
            desc = _describe(self, op, tensors)
        except Exception:  # noqa: BLE001 - describing must never stop the call itself
            desc = None
        if desc is None:
            return method(self, *args, **kwargs)
        tracker = runtime.collectives
        rec = tracker.begin(desc, call_sites.caller_site(1))
        nesting.depth += 1
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            tracker.end(rec, ok=False, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            nesting.depth -= 1
        try:
            completion.finish_async(tracker, rec, result, on_gpu=False)
        except Exception:  # noqa: BLE001
            tracker.end(rec, via="return")
        return result

    setattr(recorded, WRAPPED_MARK, method)
    return recorded
