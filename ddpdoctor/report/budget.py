"""The report's budget: any run, however long, gives a page under 20 MB made in under 15 s.

A page draws one bar per span and one point per step; 64 ranks x 3,000 steps is 600,000 spans,
which plotly turns into a 54 MB page that takes most of a minute to build (and a browser longer
to open). Past the budget the page shows every k-th step of each rank (its data wait and its
collectives with it: the spans of the same steps), and says so at its top; what the budget keeps
whole is what a diagnosis is about: waits that never completed, and a hang culprit's stall.
The trace (Chrome/Perfetto) gets a larger budget, downsampled the same way and marked likewise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpdoctor.rank_ranges import named_ranks
from ddpdoctor.report.timeline import Span, Timeline

PAGE_SPANS = 16_000  # bars on the page's timeline
PAGE_POINTS = 16_000  # points of the step-time chart
TRACE_SPANS = 60_000  # complete events in the trace (about 150 bytes each)
# Never thinned: a collective that never completed, a culprit's stall: what the verdict is about.
KEPT_WHOLE = frozenset({"wait", "stalled"})


@dataclass(frozen=True)
class Thinned:
    """What the budget kept: the spans and points to draw, and a note when it dropped any."""

    spans: list[Span]
    step_times: dict[int, list[tuple[int, float]]]
    every: int  # 1: all of them; k: every k-th step of each rank
    note: str | None


def thin(timeline: Timeline, max_spans: int, max_points: int = PAGE_POINTS) -> Thinned:
    """The timeline within `max_spans` spans and `max_points` step points."""
    spans = list(timeline.spans)
    kept_whole = [s for s in spans if s.kind in KEPT_WHOLE]
    rest = [s for s in spans if s.kind not in KEPT_WHOLE]
    points = sum(len(r.step_times) for r in timeline.ranks.values())
    room = max(1, max_spans - len(kept_whole))
    every = max(1, math.ceil(len(rest) / room), math.ceil(points / max(1, max_points)))
    if every == 1:
        steps = {rank: list(r.step_times) for rank, r in timeline.ranks.items()}
        return Thinned(spans, steps, 1, _skipped_note(timeline))
    chosen = [s for s in rest if _step_of(s) % every == 0] + kept_whole
    if len(chosen) > max_spans:  # spans with no step (collectives between steps): by stride
        stride = math.ceil(len(chosen) / max_spans)
        chosen = [s for i, s in enumerate(chosen) if s.kind in KEPT_WHOLE or i % stride == 0]
    steps = {
        rank: [(step, sec) for step, sec in r.step_times if step % every == 0]
        for rank, r in timeline.ranks.items()
    }
    note = (
        f"This run has {len(spans):,} spans and {points:,} step times: more than the page "
        f"draws. Shown: one step in {every} of each rank ({len(chosen):,} spans), with every "
        "collective that never completed and every stall kept whole."
    )
    more = _skipped_note(timeline)
    note = f"{note} {more}" if more else note
    return Thinned(sorted(chosen, key=lambda s: (s.rank, s.start)), steps, every, note)


def _skipped_note(timeline: Timeline) -> str | None:
    if not timeline.skipped:
        return None
    return (
        f"The event files of {named_ranks(timeline.skipped)} are longer than the report reads: "
        "their start and their end are shown, the middle is left out."
    )


def _step_of(span: Span) -> int:
    """The step a span belongs to (its `step` argument, else the number in its name), or 0."""
    step = span.args.get("step")
    if isinstance(step, int):
        return step
    seq = span.args.get("seq")
    return seq if isinstance(seq, int) else 0
