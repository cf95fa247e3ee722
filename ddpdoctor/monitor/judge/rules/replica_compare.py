"""The comparison under the replicas rules (replicas.py, replica_updates.py): each rank's digests
by model, step and replica group, the ranks' digests of one step compared, and the call whose
count differs between them (runtime/replica_calls.py), said with its line and steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.replicas import ReplicaCall, ReplicaDigest
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.rank_ranges import named_ranks

NAMES_SHOWN = 6


@dataclass(frozen=True)
class Split:
    """The ranks' digests of one step, compared."""

    step: int
    groups: tuple[tuple[int, ...], ...]  # ranks with equal digests, the largest group first
    differing: tuple[str, ...]  # tensor names whose digests differ
    compared: int  # how many tensors were compared

    @property
    def agree(self) -> bool:
        return len(self.groups) <= 1

    @property
    def deviants(self) -> tuple[int, ...]:
        """The ranks outside a strict majority; every rank when no group is the majority."""
        if self.agree:
            return ()
        if len(self.groups[0]) > len(self.groups[1]):
            return tuple(sorted(r for g in self.groups[1:] for r in g))
        return tuple(sorted(r for g in self.groups for r in g))


def compare(step: int, digests: dict[int, ReplicaDigest]) -> Split:
    """Compare the ranks' digests of one step on the tensors every one of them digested."""
    maps = {rank: d.by_name() for rank, d in digests.items()}
    common = sorted(set.intersection(*(set(m) for m in maps.values()))) if maps else []
    keyed: dict[tuple[int, ...], list[int]] = {}
    for rank, values in sorted(maps.items()):
        keyed.setdefault(tuple(values[n] for n in common), []).append(rank)
    groups = sorted((tuple(g) for g in keyed.values()), key=lambda g: (-len(g), g))
    differing: tuple[str, ...] = ()
    if len(groups) > 1:
        differing = tuple(n for n in common if len({m[n] for m in maps.values()}) > 1)
    return Split(step, tuple(groups), differing, len(common))


# Each rank's digests: (rank, its digests), from a snapshot's views or read from a run directory.
Ranks = Sequence[tuple[int, Sequence[ReplicaDigest]]]


def of_snapshot(snap: Snapshot) -> Ranks:
    with_digests = rank_index.of(snap).with_replica_digests
    return [(v.rank, v.replica_digests) for v in with_digests if v.replica_digests]


def by_step(ranks: Ranks, model: int) -> dict[int, dict[int, ReplicaDigest]]:
    steps: dict[int, dict[int, ReplicaDigest]] = {}
    for rank, digests in ranks:
        for digest in digests:
            if digest.model == model and not digest.final:
                steps.setdefault(digest.step, {})[rank] = digest
    return steps


def finals(ranks: Ranks, model: int) -> dict[int, ReplicaDigest]:
    out: dict[int, ReplicaDigest] = {}
    for rank, digests in ranks:
        for digest in digests:
            if digest.model == model and digest.final:
                out[rank] = digest
    return out


def calls_of(digest: ReplicaDigest | None) -> dict[object, ReplicaCall]:
    return {c.key: c for c in digest.calls} if digest is not None else {}


def count_of(calls: dict[object, ReplicaCall], key: object) -> int:
    call = calls.get(key)
    return call.count if call is not None else 0


def culprit_call(
    bad: dict[int, ReplicaDigest], good: dict[int, ReplicaDigest], split: Split
) -> tuple[ReplicaCall, tuple[int, ...], dict[int, int]] | None:
    """The call whose count differs between the ranks at the first differing digest, preferring
    one that began to differ since the last agreeing one, then one into the DDP model; with the
    ranks that made it more often than the rest and each rank's count."""
    now = {rank: calls_of(d) for rank, d in bad.items()}
    before = {rank: calls_of(good.get(rank)) for rank in bad}
    keys = {k for calls in now.values() for k in calls}
    best: tuple[tuple[int, int, int], object] | None = None
    for key in keys:
        counts = {rank: count_of(calls, key) for rank, calls in now.items()}
        if len(set(counts.values())) < 2:
            continue
        earlier = {rank: count_of(before[rank], key) for rank in bad}
        fresh = len(set(earlier.values())) < 2 if good else True
        call = next(now[r][key] for r in sorted(now) if key in now[r])
        is_load = call.what.endswith("load_state_dict")
        rank_key = (0 if fresh else 1, 0 if call.ddp else 1, 0 if is_load else 1)
        if best is None or rank_key < best[0]:
            best = (rank_key, key)
    if best is None:
        return None
    key = best[1]
    counts = {rank: count_of(calls, key) for rank, calls in now.items()}
    top = max(counts.values())
    makers = tuple(sorted(r for r, c in counts.items() if c == top))
    deviants = set(split.deviants)
    if deviants and len(deviants) < len(bad):  # a majority: the call the minority made
        minority = {r: c for r, c in counts.items() if r in deviants}
        majority = {c for r, c in counts.items() if r not in deviants}
        odd = tuple(sorted(r for r, c in minority.items() if c not in majority))
        makers = odd or makers
    call = now[makers[0]][key]
    return call, makers, counts


def call_text(call: ReplicaCall, makers: tuple[int, ...], counts: dict[int, int]) -> str:
    where = f" at {call.site.describe()}" if call.site is not None else ""
    first = call.steps[0] if call.steps else None
    if call.count == 1 and first is not None:
        when = f" at step {first}"
    elif first is not None:
        when = f" {call.count} times, from step {first}"
    else:
        when = f" {call.count} times"
    others = sorted(r for r in counts if r not in makers)
    never = [r for r in others if counts[r] == 0]
    some = [r for r in others if counts[r]]
    parts = [f"{named_ranks(never)} never did"] if never else []
    parts += [f"rank {r} {counts[r]} times" for r in some[:4]]
    tail = f" ({'; '.join(parts)})" if parts else ""
    return f"{named_ranks(list(makers))} called {call.what}{where}{when}{tail}"


def names_text(split: Split) -> str:
    shown = ", ".join(split.differing[:NAMES_SHOWN])
    more = len(split.differing) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def partitions(ranks: Ranks, model: int) -> list[Ranks]:
    """One model's digests split by the replica the ranks hold: the ranks that name the same
    peers (an HSDP replicate group, the process group of a DDP model or ZeRO optimizer that is
    not the whole world) are compared among themselves; digests that name none, all together.
    A rank that names peers without itself in them is left out."""
    parts: dict[tuple[int, ...] | None, list[tuple[int, Sequence[ReplicaDigest]]]] = {}
    for rank, digests in ranks:
        mine = [d for d in digests if d.model == model]
        if not mine:
            continue
        peers = mine[-1].peers
        if peers is not None and rank not in peers:
            continue
        parts.setdefault(peers, []).append((rank, mine))
    return [parts[k] for k in sorted(parts, key=lambda k: k or ())]


def what_of(digest: ReplicaDigest) -> str:
    """The replica, as the finding names it."""
    if digest.kind == "hsdp":
        group = f" (replicate group {named_ranks(list(digest.peers))})" if digest.peers else ""
        return f"the HSDP model's shards{group}"
    if digest.kind == "zero":
        return "the ZeRO optimizer's parameters"
    return "the model" if digest.model == 0 else f"the DDP model #{digest.model}"


def models(ranks: Ranks) -> list[int]:
    return sorted({d.model for _, digests in ranks for d in digests})
