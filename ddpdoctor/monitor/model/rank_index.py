"""Which ranks of a snapshot each rule needs to look at, found in one pass per snapshot.

The rules run on every snapshot, twice a second, and most of them look for a few ranks among
all of them: the failed ones, those in a collective, those with warnings or error lines. At
1000s of ranks it is the walks that cost, not the tests: a walk reads one field of every rank's
view, each view a cache miss, and the rules made about fifteen of them per diagnosis. `of(snap)`
gives the snapshot's RankIndex, made on first use in one walk that reads each view once, and
kept on the snapshot (which never changes, so neither does its index).

Each list holds the ranks a rule may need, in the snapshot's order: the rule still tests every
rank it gets with its own condition, so a list may hold more ranks than the rule wants, never
fewer. Under `walking_every_rank()` every list is all the ranks and the rules that read more
than a list take the walk they took before this index: the reference the tests (and
DDPDOCTOR_CHECK_INDEX, judge/diagnose.py) compare each diagnosis with.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot

# Steps a rank's timings must average before its own work counts (the straggler's judgement).
MIN_OWN_WORK_STEPS = 5

# The reference way: every list all the ranks (set by walking_every_rank, in this context only).
_FULL_WALK: contextvars.ContextVar[bool] = contextvars.ContextVar("full_walk", default=False)
# Where a snapshot keeps its indexes: one per way, so that a check of both compares two builds.
_KEPT = {False: "_rank_index", True: "_rank_index_full"}


class RankIndex:
    """The ranks of one snapshot by what the rules look for (see the module's note). With
    `narrow` False every list is every rank and nothing else is made (the reference)."""

    def __init__(self, ranks: Sequence[RankView], *, narrow: bool = True) -> None:
        self.narrow = narrow
        everyone = [] if narrow else list(ranks)  # (narrow: the walk below makes each)
        # not RUNNING nor IN_COLLECTIVE: every failed, finished, waiting, stalled or new rank
        self.unsettled = everyone
        self.in_collective = everyone  # collective is not None
        self.with_warnings = everyone
        self.with_error_lines = everyone
        self.with_replica_digests = everyone
        self.with_loader_batches = everyone
        self.loader_batches: list[tuple[tuple[int, int], ...]] = []  # ... theirs (narrow only)
        self.with_calls = everyone  # recent_collectives not empty
        self.ranks_with_calls: list[int] = []  # ... their ranks (narrow only)
        # one rank per distinct sequence of latest calls: RankView.calls_key, else -1 - its
        # rank, the first rank of each in the snapshot's order (narrow only)
        self.call_classes: dict[int, RankView] = {}
        # rank -> data + compute time per step, for the ranks with MIN_OWN_WORK_STEPS of them,
        # in the snapshot's order (narrow only)
        self.own_work: dict[int, float] = {}
        if narrow:
            self._walk(ranks)

    def _walk(self, ranks: Sequence[RankView]) -> None:
        """Every list in one pass over the views (the attributes of one view read together)."""
        unsettled: list[RankView] = []
        in_collective: list[RankView] = []
        warned: list[RankView] = []
        erred: list[RankView] = []
        digested: list[RankView] = []
        loaded: list[RankView] = []
        loaders: list[tuple[tuple[int, int], ...]] = []
        called: list[RankView] = []
        called_ranks: list[int] = []
        classes, own = self.call_classes, self.own_work
        running, in_coll, min_steps = RankState.RUNNING, RankState.IN_COLLECTIVE, MIN_OWN_WORK_STEPS
        for view in ranks:
            rank = view.rank
            state = view.state
            if state is not running and state is not in_coll:
                unsettled.append(view)
            if view.collective is not None:
                in_collective.append(view)
            if view.warnings:
                warned.append(view)
            if view.error_lines:
                erred.append(view)
            if view.replica_digests:
                digested.append(view)
            batches = view.loader_batches
            if batches:
                loaded.append(view)
                loaders.append(batches)
            if view.recent_collectives:
                called.append(view)
                called_ranks.append(rank)
            key = view.calls_key or -1 - rank
            if key not in classes:
                classes[key] = view
            data, compute = view.avg_data_time_s, view.avg_compute_time_s
            if view.avg_steps >= min_steps and (data is not None or compute is not None):
                own[rank] = (data or 0.0) + (compute or 0.0)
        self.unsettled, self.in_collective = unsettled, in_collective
        self.with_warnings, self.with_error_lines = warned, erred
        self.with_replica_digests = digested
        self.with_loader_batches, self.loader_batches = loaded, loaders
        self.with_calls, self.ranks_with_calls = called, called_ranks


def of(snap: Snapshot) -> RankIndex:
    """The snapshot's index, made on first use (the reference one under walking_every_rank)."""
    full = _FULL_WALK.get()
    kept = _KEPT[full]
    index = snap.__dict__.get(kept)
    if index is None:
        index = RankIndex(snap.ranks, narrow=not full)
        # (the snapshot is frozen, its ranks with it: the index stays true as long as it lives;
        # kept out of its fields, as CollectiveView keeps its signature, so eq and repr ignore it)
        object.__setattr__(snap, kept, index)
    return index


@contextmanager
def walking_every_rank() -> Iterator[None]:
    """Within: each rule walks every rank, as it did before this index (the reference)."""
    token = _FULL_WALK.set(True)
    try:
        yield
    finally:
        _FULL_WALK.reset(token)
