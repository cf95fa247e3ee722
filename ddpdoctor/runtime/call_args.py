"""Reading a torch.distributed call's arguments: the tensors it sends or receives, and for a
point-to-point call the peer's global rank and the ops of a batch (c10d_hooks.describe_call)."""

from __future__ import annotations

from typing import Any

from ddpdoctor.runtime.collectives import GroupInfo
from ddpdoctor.runtime.patching import WRAPPED_MARK


def tensors_of(value: Any) -> list[Any]:
    """The tensors in an argument: a tensor, a list of them, a list of lists, or P2POps."""
    if value is None:
        return []
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [value]
    if isinstance(value, list | tuple):
        found: list[Any] = []
        for item in value:
            tensor = getattr(item, "tensor", None)  # a P2POp of batch_isend_irecv
            if tensor is not None and hasattr(tensor, "shape"):
                found.append(tensor)
            elif hasattr(item, "shape") and hasattr(item, "dtype"):
                found.append(item)
            elif isinstance(item, list | tuple):
                found.extend(t for t in item if hasattr(t, "shape") and hasattr(t, "dtype"))
        return found
    return []


def global_rank(group: GroupInfo, group_rank: int) -> int:
    """The global rank of a group's rank (the world's ranks are their own)."""
    if group.ranks is not None and 0 <= group_rank < len(group.ranks):
        return group.ranks[group_rank]
    return group_rank


MAX_PARTS = 16  # the ops of one batch_isend_irecv listed in its event


def batch_parts(ops: Any) -> tuple[tuple[str, int, int], ...]:
    """(op, the peer's global rank, tag) of the first ops of a batch_isend_irecv: P2POp keeps
    its peer as a global rank already."""
    parts: list[tuple[str, int, int]] = []
    for op in list(ops)[:MAX_PARTS]:
        func = getattr(op, "op", None)
        func = getattr(func, WRAPPED_MARK, func)
        name = getattr(func, "__name__", "?")
        peer = getattr(op, "peer", None)
        if peer is None:
            continue
        parts.append((name, int(peer), int(getattr(op, "tag", 0) or 0)))
    return tuple(parts)
