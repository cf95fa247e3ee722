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

Only ddpdoctor's own commands call `pace_for_watching`: the library, imported into a user's
process, leaves that process's collector alone.
"""

from __future__ import annotations

import gc

WATCHER_THRESHOLDS = (5000, 10, 100)


def pace_for_watching() -> None:
    """Set this process's collector to a watcher's pace (once, at the start of a command)."""
    gc.set_threshold(*WATCHER_THRESHOLDS)
