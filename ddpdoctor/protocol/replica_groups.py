"""torchft's replica groups in the events: the `torchft` event kind and how ranks are numbered.

A torchft job is a lighthouse and several replica groups, each its own torchrun; the runtime
(ddpdoctor/runtime/torchft_hooks.py) makes each process that builds a `torchft.Manager` a rank
numbered as torchft numbers it (replica group index x group size + rank in the group), and says
in its hello `torchft: {replica_group, replica_id, group_rank, group_world_size,
process_group}`.

`torchft` events (`what`):
    quorum   a quorum this rank joined that differs from its last one: quorum_id, replica_rank,
             replica_world_size, replica_groups (the groups in it), replica_ids, left / joined
             (groups since this rank's previous quorum), step, max_step; heal_from /
             heal_from_group when this rank heals from a peer, send_to when it sends its state
             to recovering peers.
    healed   the state received from the peer is loaded (step: the step it resumes at).
Collectives of torchft's process groups are recorded in groups named `torchft:q<quorum
id>:g<rank in the replica group>`: one group per quorum, so their numbers start again with it.
"""

from __future__ import annotations

TORCHFT = "torchft"  # the event kind
QUORUM = "quorum"
HEALED = "healed"
GROUP_PREFIX = "torchft:"


def group_index(replica_id: str | None) -> int | None:
    """The replica group index in a torchft replica id (`train_ddp_1:<uuid>` -> 1): the trailing
    digits of the part before the first colon, as torchft numbers its ranks; None without."""
    if not replica_id:
        return None
    head = replica_id.split(":", 1)[0][:200]
    digits = len(head) - len(head.rstrip("0123456789"))
    return int(head[len(head) - digits :]) if digits else None


def is_torchft_group(name: str | None) -> bool:
    return bool(name) and str(name).startswith(GROUP_PREFIX)
