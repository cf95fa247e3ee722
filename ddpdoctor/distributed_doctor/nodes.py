"""Nodes of a job and how findings name them: "node 1 (vm, rank 1)".

A node is a host name AND a node rank (torchrun's GROUP_RANK, Slurm's SLURM_NODEID): two launchers
on one machine share a host name but are two nodes to torch.distributed. Where the launcher gives
no node rank (MPI), ranks on one host form one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddpdoctor.rank_ranges import fold_ranks


@dataclass(frozen=True)
class Member:
    """One rank as the node map needs it."""

    rank: int
    host: str
    node_rank: int | None = None
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id: equal on one running kernel


@dataclass(frozen=True)
class Node:
    index: int
    host: str
    node_rank: int | None
    ranks: tuple[int, ...]
    boot_id: str | None = None

    @property
    def label(self) -> str:
        noun = "rank" if len(self.ranks) == 1 else "ranks"
        return f"node {self.index} ({self.host}, {noun} {fold_ranks(self.ranks)})"

    @property
    def short(self) -> str:
        return f"node {self.index} ({self.host})"


class NodeMap:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(sorted(nodes, key=lambda n: n.index))
        self._by_rank = {rank: node for node in self.nodes for rank in node.ranks}

    @classmethod
    def build(cls, members: Iterable[Member]) -> NodeMap:
        grouped: dict[tuple[str, int | None], list[Member]] = {}
        for member in sorted(members, key=lambda m: m.rank):
            grouped.setdefault((member.host, member.node_rank), []).append(member)
        # A node is shown as "node <node rank>"; nodes without one (or a node rank claimed twice,
        # a copy-paste --node-rank: F07) get the lowest free index instead.
        taken: set[int] = set()
        for _, node_rank in grouped:
            if node_rank is not None:
                taken.add(node_rank)
        used: set[int] = set()
        nodes = []
        for (host, node_rank), group in grouped.items():  # in order of each node's lowest rank
            index = node_rank
            if index is None or index in used:
                index = next(i for i in range(len(grouped) + len(taken) + 1) if i not in taken)
                taken.add(index)
            used.add(index)
            boot = next((m.boot_id for m in group if m.boot_id), None)
            ranks = tuple(m.rank for m in group)
            nodes.append(Node(index, host, node_rank, ranks, boot))
        return cls(nodes)

    def duplicate_node_ranks(self) -> dict[int, list[Node]]:
        """Node ranks claimed by more than one host: {node rank: the nodes claiming it}."""
        claims: dict[int, list[Node]] = {}
        for node in self.nodes:
            if node.node_rank is not None:
                claims.setdefault(node.node_rank, []).append(node)
        return {rank: nodes for rank, nodes in claims.items() if len(nodes) > 1}

    def node_of(self, rank: int) -> Node:
        return self._by_rank[rank]

    def short_of(self, rank: int) -> str:
        """ "node 1 (h2)": the node holding `rank`."""
        return self.node_of(rank).short

    def describe(self, ranks: Iterable[int], *, limit: int = 4) -> str:
        """The nodes holding `ranks`, each with just those ranks: "node 1 (vm, rank 1)"."""
        chosen = sorted(set(ranks))
        per_node: dict[int, list[int]] = {}
        for rank in chosen:
            per_node.setdefault(self.node_of(rank).index, []).append(rank)
        parts = []
        for index, node_ranks in sorted(per_node.items()):
            node = next(n for n in self.nodes if n.index == index)
            noun = "rank" if len(node_ranks) == 1 else "ranks"
            parts.append(f"node {index} ({node.host}, {noun} {fold_ranks(node_ranks)})")
        if len(parts) > limit:
            indices = fold_ranks(sorted(per_node))
            return f"nodes {indices} ({len(parts)} nodes)"
        if len(parts) <= 2:
            return " and ".join(parts)
        return ", ".join(parts[:-1]) + " and " + parts[-1]

    def __len__(self) -> int:
        return len(self.nodes)
