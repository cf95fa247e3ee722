"""mismatch: ranks at the same sequence number of a group in different collectives, or in the
same op with different shapes or dtypes (F29 rank-conditional collectives, F30 shape mismatch).

On gloo the receiving rank usually aborts ("Received data size doesn't match expected size", exit
-6) and its peers fail with "Connection reset/closed by peer"; on NCCL the ranks hang or silently
exchange wrong data. Either way the per-rank sequence of collectives names both sides.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import (
    RuleOutcome,
    call_sites,
    confirmed_mismatch,
    framework_fix,
)
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import (
    CALL_WINDOW,
    POINT_TO_POINT_OPS,
    CallSite,
    CollectiveView,
    Snapshot,
)
from ddpdoctor.rank_ranges import named_ranks

FIX = (
    "Make every rank call the same collectives, in the same order, with tensors of the same "
    "shape and dtype: no collective (or DDP forward) under `if rank == 0`, pad variable-size "
    "tensors to a common shape (or use all_gather_object), sort dict keys before reducing, and "
    "give every rank the same number of batches; a full state dict (get_model_state_dict with "
    "full_state_dict=True, DTensor.full_tensor()) gathers from every rank: build it on all "
    "ranks and save it on rank 0 only. TORCH_DISTRIBUTED_DEBUG=DETAIL makes PyTorch "
    "check each collective's fingerprint (slower; for a diagnostic rerun)."
)
_FAULT_KINDS = ("mismatch", "shape")
# What a rank prints when the transport itself notices different collectives (gloo's size check,
# TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprints, old NCCL's check).
_MISMATCH_MESSAGE = re.compile(
    r"Received data size doesn't match expected size|Detected mismatch between collectives|"
    r"Mismatched collective detected"
)


def _calls(view) -> list[CollectiveView]:
    """The latest calls of a rank: ranks that disagree get stuck (or abort) at the first differing
    call, so it stays among them; a silent mismatch passes through them."""
    colls = list(view.recent_collectives[-CALL_WINDOW:])
    if view.collective is not None and view.collective not in colls:
        colls.append(view.collective)
    return [c for c in colls if c.op not in POINT_TO_POINT_OPS]


def detect(snap: Snapshot) -> RuleOutcome | None:
    # One pass: the first call seen at each (group, seq), and the keys where another rank differs.
    first: dict[tuple[str, int], tuple] = {}
    differing: set[tuple[str, int]] = set()
    get = first.get
    # Ranks with the same latest calls (the same calls_key) need comparing only once.
    index = rank_index.of(snap)
    classes = index.call_classes
    if not index.narrow:  # (the reference: the walk the index makes, on its own)
        classes = {}
        for view in snap.ranks:
            classes.setdefault(view.calls_key or -1 - view.rank, view)
    for view in classes.values():
        for coll in _calls(view):
            key = (coll.group, coll.seq)
            sig = coll.signature()
            seen = get(key)
            if seen is None:
                first[key] = sig
            elif seen is not sig and seen != sig:
                differing.add(key)
    if not differing:
        return _from_abort_message(snap)
    key = min(differing, key=lambda k: (k[1], k[0]))
    divergence = call_sites.first_divergence(snap)
    if divergence is not None and divergence.seq <= key[1]:
        return _from_divergence(snap, divergence, key)
    by_rank: dict[int, CollectiveView] = {}
    frequency: Counter = Counter()
    for view in snap.ranks:
        for coll in _calls(view):
            frequency[coll.signature()] += 1
            if (coll.group, coll.seq) == key:
                by_rank[view.rank] = coll
    sides: dict[tuple, list[int]] = defaultdict(list)
    for rank, coll in by_rank.items():
        sides[coll.signature()].append(rank)
    return _outcome(snap, by_rank, sides, frequency)


def _outcome(
    snap: Snapshot,
    by_rank: dict[int, CollectiveView],
    sides: dict[tuple, list[int]],
    frequency: Counter,
) -> RuleOutcome:
    ordered = sorted(sides.items(), key=lambda kv: (-len(kv[1]), frequency[kv[0]]))
    culprits = _culprits(snap, sides, frequency)
    parts = []
    evidence = []
    for _sig, ranks in ordered:
        coll = by_rank[ranks[0]]
        parts.append(f"{named_ranks(ranks)}: {coll.describe()}")
        for rank in ranks[:4]:
            view = snap.rank(rank)
            where = f", phase {view.phase}, step {view.step}" if view and view.phase else ""
            evidence.append(Evidence(f"rank {rank} called {by_rank[rank].describe()}{where}"))
    first = next(iter(by_rank.values()))
    summary = f"collective mismatch at #{first.seq}" + (
        f" of group {first.group}" if first.group != "default" else ""
    )
    summary += ": " + "; ".join(parts)
    starts = [c.since_t for c in by_rank.values() if c.since_t is not None]
    return _mismatch(summary, culprits, evidence, max(starts) if starts else snap.taken_t)


def _mismatch(
    summary: str,
    culprits: Iterable[int],
    evidence: Iterable[Evidence],
    onset: float | None,
    site: CallSite | None = None,
) -> RuleOutcome:
    """The rule's outcome: a confirmed mismatch of `culprits` that held from `onset` (`site`: the
    extra call's, whose framework spells the fix)."""
    ranks = tuple(sorted(culprits))
    finding = Finding(
        id="mismatch",
        severity=Severity.ERROR,
        summary=summary,
        fix=framework_fix.with_framework(FIX, site),
        ranks=ranks,
        evidence=tuple(evidence),
    )
    return confirmed_mismatch("mismatch", finding, onset)


def _from_divergence(
    snap: Snapshot, divergence: call_sites.Divergence, key: tuple[str, int]
) -> RuleOutcome:
    """The ranks disagree at `key`; their call sites show where it began: one side's extra call
    at an earlier (or the same) number, which the transport may have paired with another."""
    evidence = list(divergence.evidence())
    if divergence.seq < key[1]:
        later: list[str] = []
        for view in snap.ranks:
            coll = next((c for c in _calls(view) if (c.group, c.seq) == key), None)
            if coll is not None and len(later) < 4:
                later.append(f"rank {view.rank}: {coll.describe()}")
        evidence.append(Evidence(f"then at #{key[1]}: " + "; ".join(later)))
    starts = [
        c.since_t
        for c in (divergence.call, divergence.other_call)
        if c is not None and c.since_t is not None
    ]
    group = f" of group {divergence.group}" if divergence.group != "default" else ""
    return _mismatch(
        f"collective mismatch at #{divergence.seq}{group}: {divergence.describe()}",
        divergence.culprits,
        evidence,
        max(starts) if starts else snap.taken_t,
        divergence.call.site,
    )


def _culprits(snap: Snapshot, sides: dict[tuple, list[int]], frequency: Counter) -> list[int]:
    """The odd side out: a rank that recorded an injected mismatch, else the side whose call is
    rarest in the recent history of all ranks (a one-off call against the usual one), else all."""
    involved = [r for ranks in sides.values() for r in ranks]
    injected = [
        r
        for r in involved
        if (view := snap.rank(r)) is not None
        and view.fault
        and view.fault.split(":")[0] in _FAULT_KINDS
    ]
    if injected:
        return injected
    counts = sorted((frequency[sig], ranks) for sig, ranks in sides.items())
    if len(counts) > 1 and counts[0][0] < counts[1][0]:
        return list(counts[0][1])
    if len(sides) == 2:
        small, big = sorted(sides.values(), key=len)
        if len(small) < len(big):
            return list(small)
    return sorted(involved)


def _from_abort_message(snap: Snapshot) -> RuleOutcome | None:
    """A rank that aborted on a mismatch may die before its own call reaches its event file; its
    stderr still says what happened, and its peers' calls at the next sequence number say which
    collective the others were in."""
    for view in rank_index.of(snap).with_error_lines:
        if not view.error_lines:
            continue
        line = next((ln for ln in view.error_lines if _MISMATCH_MESSAGE.search(ln.text)), None)
        if line is None:
            continue
        # the group of its latest call (a mesh dimension's group for FSDP, TP and HSDP)
        calls = _calls(view)
        group = calls[-1].group if calls else "default"
        seq = view.seq_in(group) + 1
        peers = {}
        for other in snap.ranks:
            if other.rank == view.rank:
                continue
            for coll in _calls(other):
                if coll.group == group and coll.seq == seq:
                    peers[other.rank] = coll
        if not peers:
            continue
        sides: dict[tuple, list[int]] = defaultdict(list)
        for rank, coll in peers.items():
            sides[coll.signature()].append(rank)
        parts = [f"{named_ranks(r)}: {peers[r[0]].describe()}" for r in sides.values()]
        parts.append(
            f"rank {view.rank}: a different call (it aborted before the call was recorded)"
        )
        evidence = [Evidence(line.text, line.file, line.line_no)]
        evidence += [
            Evidence(f"rank {r} called {c.describe()}") for r, c in list(peers.items())[:4]
        ]
        starts = [c.since_t for c in peers.values() if c.since_t is not None]
        onset = min(starts) if starts else view.failed_t
        culprits = [view.rank, *sorted(peers)]
        injected = [
            r
            for r in culprits
            if (v := snap.rank(r)) and v.fault and v.fault.split(":")[0] in _FAULT_KINDS
        ]
        where = f" of group {group}" if group != "default" else ""
        summary = f"collective mismatch at #{seq}{where}: " + "; ".join(parts)
        return _mismatch(summary, injected or culprits, evidence, onset)
    return None
