"""The garbage collector's pace in a process whose work is watching a run (`ddpdoctor run`, `watch`).

A watcher polls every half second and, per rank, makes a view and a few records that live one
poll, while it keeps a tracker per rank for the whole run. CPython's default pace (a young
collection every 700 new objects, an older one every 10 of those) then walks the thousands of
long-lived trackers again and again: node 0 of 1024 nodes x 8 ranks spent more than a quarter of
its time on it (benchmarks/merge_scale.py: 166 against 119 microseconds per remote rank per
second).
Collecting young objects every WATCHER_THRESHOLDS[0] new ones keeps the same collections, less
often; reference counting still frees every object that is not in a cycle the moment it is
dropped, so memory stays where it was. The oldest generation, every object of the process (at
8192 ranks a few hundred thousand: a tenth of a second a pass), is collected after 100 middle
collections instead of 10: a cycle left behind waits a few minutes for it, not a few seconds.

A watcher of many ranks makes many more young objects a poll (at 8192 ranks, a view and its
parts per rank that changed): collected every 5000 of them, each view is walked by a young and a
middle collection before the next poll replaces it, and at 8192 ranks that walking was a fifth
of node 0's time. So the young threshold grows with the ranks followed (`fit_to_ranks`, every
poll): YOUNG_PER_RANK of them per rank, most of a poll's objects dead by reference counting before
a collection comes (benchmarks/merge_scale.py: node 0 at 8192 ranks 0.77x as costly), and at
most YOUNG_MAX, so that cyclic garbage still waits for a bounded number of allocations.

Only ddpdoctor's own commands call `pace_for_watching`: the library, imported into a user's
process, leaves that process's collector alone (and `fit_to_ranks` does nothing there).
"""

from __future__ import annotations

import gc

WATCHER_THRESHOLDS = (5000, 10, 100)
YOUNG_PER_RANK = 50
YOUNG_MAX = 1_000_000

_watching = False  # pace_for_watching was called: this process is ddpdoctor's own watcher


def pace_for_watching() -> None:
    """Set this process's collector to a watcher's pace (once, at the start of a command)."""
    global _watching
    _watching = True
    gc.set_threshold(*WATCHER_THRESHOLDS)


def thresholds_for(ranks: int) -> tuple[int, int, int]:
    """The collector's thresholds for a watcher that follows `ranks` ranks."""
    young = min(YOUNG_MAX, max(WATCHER_THRESHOLDS[0], YOUNG_PER_RANK * ranks))
    return young, WATCHER_THRESHOLDS[1], WATCHER_THRESHOLDS[2]


def fit_to_ranks(ranks: int) -> None:
    """A watcher's pace for the ranks it follows now (every poll: a world that grows, an elastic
    job, a watcher that learns of the other nodes' ranks late); nothing outside a watcher."""
    if _watching:
        wanted = thresholds_for(ranks)
        if gc.get_threshold() != wanted:
            gc.set_threshold(*wanted)
