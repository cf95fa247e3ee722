"""Short, fixed-width text for the live views: durations, rates, bars, sparklines, colours.

Pure functions of their arguments (no clock, no terminal), so the views render the same snapshot
the same way every time: that is what makes the SVG snapshot tests deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text

from ddpdoctor.findings import Severity
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.rank_ranges import fold_ranks

VERDICT_STYLES: dict[Verdict, str] = {
    Verdict.RUNNING: "bold white on dodger_blue3",
    Verdict.HEALTHY: "bold black on green3",
    Verdict.HANG: "bold white on red3",
    Verdict.MISMATCH: "bold white on dark_magenta",
    Verdict.CRASH: "bold white on red3",
    Verdict.NOT_STARTED: "bold white on red3",
    Verdict.INTERRUPTED: "bold black on yellow3",
    Verdict.NOT_DISTRIBUTED: "bold black on grey70",
    Verdict.NOT_INSTRUMENTED: "bold black on yellow3",
}

# Short labels keep the state column narrow; the colours are the point: waiting yellow,
# stalled orange, failed red, so a hang's victims and its culprit stand apart at a glance.
STATE_LABELS: dict[RankState, str] = {
    RankState.STARTING: "starting",
    RankState.RUNNING: "running",
    RankState.IN_COLLECTIVE: "collective",
    RankState.WAITING: "waiting",
    RankState.STALLED: "stalled",
    RankState.DONE: "done",
    RankState.FAILED: "failed",
    RankState.GONE: "gone",
}

STATE_STYLES: dict[RankState, str] = {
    RankState.STARTING: "dim",
    RankState.RUNNING: "green",
    RankState.IN_COLLECTIVE: "cyan",
    RankState.WAITING: "yellow",
    RankState.STALLED: "bold dark_orange",
    RankState.DONE: "dim green",
    RankState.FAILED: "bold red",
    RankState.GONE: "bold magenta",
}

# Worst first when a host row summarises its ranks, and for the "state" sort.
STATE_SEVERITY: dict[RankState, int] = {
    RankState.FAILED: 7,
    RankState.GONE: 6,
    RankState.STALLED: 5,
    RankState.WAITING: 4,
    RankState.STARTING: 3,
    RankState.IN_COLLECTIVE: 2,
    RankState.RUNNING: 1,
    RankState.DONE: 0,
}

SEVERITY_MARKS: dict[Severity, tuple[str, str]] = {
    Severity.ERROR: ("✗", "bold red"),
    Severity.WARNING: ("!", "bold yellow"),
    Severity.INFO: ("i", "cyan"),
}

LEVEL_STYLES = {"error": "bold red", "warn": "yellow", "info": ""}


# Lookups that never fail: a state or verdict added to the snapshot schema later still renders.
def verdict_style(verdict: Verdict) -> str:
    return VERDICT_STYLES.get(verdict, "bold white on grey37")


NOT_STARTED_STYLE = "bold white on red"


def verdict_badge(snapshot: Snapshot) -> Text:
    """ " HANG " in the verdict's colours; " NOT STARTED " for a run none of whose ranks started."""
    if snapshot.never_started:
        return Text(" NOT STARTED ", style=NOT_STARTED_STYLE)
    label = f" {str(getattr(snapshot.verdict, 'value', snapshot.verdict)).upper()} "
    return Text(label, style=verdict_style(snapshot.verdict))


def state_label(state: RankState) -> str:
    return STATE_LABELS.get(state) or str(getattr(state, "value", state))


def state_style(state: RankState) -> str:
    return STATE_STYLES.get(state, "")


def state_severity(state: RankState) -> int:
    return STATE_SEVERITY.get(state, 3)


def severity_mark(severity: Severity) -> tuple[str, str]:
    return SEVERITY_MARKS.get(severity, ("?", "bold"))


CULPRIT_STYLE = "bold white on red3"
CULPRIT_MARK = "★"
NONE = "-"

_SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
_BAR_EIGHTHS = " ▏▎▍▌▋▊▉"


def duration(seconds: float | None) -> str:
    """0.4s, 12.3s, 4m05s, 2h03m: short enough for a narrow column."""
    if seconds is None:
        return NONE
    if seconds < 0:
        seconds = 0.0
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def clock(seconds: float | None) -> str:
    """Elapsed time as H:MM:SS."""
    if seconds is None:
        return "-:--:--"
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def step_seconds(seconds: float | None) -> str:
    """A step time with three significant figures: 0.213s, 1.42s, 12.5s."""
    if seconds is None:
        return NONE
    if seconds < 1:
        return f"{seconds:.3f}s"
    if seconds < 10:
        return f"{seconds:.2f}s"
    return f"{seconds:.1f}s"


def rate(value: float | None) -> str:
    """Samples per second: 87.3, 1.2k, 35k."""
    if value is None:
        return NONE
    if value < 1000:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value / 1000:.1f}k"
    return f"{value / 1000:.0f}k"


def loss(value: float | None) -> str:
    if value is None:
        return NONE
    if value != value:  # NaN: the one loss value people must notice
        return "NaN"
    if abs(value) >= 1000 or (value != 0 and abs(value) < 0.001):
        return f"{value:.2e}"
    return f"{value:.4f}"


def steps(step: int | None, total: int | None) -> str:
    if step is None:
        return NONE
    return f"{step}/{total}" if total else str(step)


def progress_bar(done: int | None, total: int | None, width: int) -> str:
    """A horizontal bar with eighth-cell resolution; blank when the total is unknown."""
    if done is None or not total or width <= 0:
        return " " * max(width, 0)
    fraction = min(max(done / total, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (_BAR_EIGHTHS[part] if part and full < width else "")
    return bar.ljust(width, "░") if full < width else bar[:width]


def level_bar(value: float, scale: float, width: int) -> str:
    """A left-aligned bar of `value` on a `scale` (no background fill), eighth-cell resolution."""
    if width <= 0:
        return ""
    if scale <= 0 or value <= 0:
        return " " * width
    eighths = round(min(value / scale, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (_BAR_EIGHTHS[part] if part and full < width else "")
    return bar.ljust(width)


def sparkline(values: Sequence[float], width: int, *, low: float, high: float) -> str:
    """The last `width` values as block characters on a SHARED scale [low, high].

    Sharing one scale across ranks is the point: a rank whose steps take twice as long draws
    twice as tall, so a straggler is seen rather than computed (Textual's Sparkline scales each
    series to its own min and max, which would hide exactly that).
    """
    if width <= 0:
        return ""
    recent = list(values)[-width:]
    span = high - low
    chars = []
    for value in recent:
        if span <= 0:
            index = 0 if value <= low else len(_SPARK_BLOCKS) - 1
        else:
            index = round((value - low) / span * (len(_SPARK_BLOCKS) - 1))
        chars.append(_SPARK_BLOCKS[min(max(index, 0), len(_SPARK_BLOCKS) - 1)])
    return "".join(chars).ljust(width)


def ranks_text(ranks: Iterable[int]) -> str:
    """0-3,5,7-8: consecutive ranks folded into ranges."""
    return fold_ranks(ranks, sep=",", empty=NONE)


def truncate(text: str, width: int) -> str:
    """Cut to `width` cells with an ellipsis, so a long op name never widens a column."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
