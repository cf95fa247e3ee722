"""Step-time sparklines per rank (per host beyond GROUP_THRESHOLD ranks), on one shared scale.

In DDP every rank waits for the slowest in the gradient all-reduce, so step times alone look alike
on every rank. Each line therefore also shows how the last step split between the rank's own work
(data + compute) and its wait inside collectives: the straggler is the one line that is all work
and no wait, while every other line is mostly wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive

from ddpdoctor.monitor.model.snapshot import RankView, Snapshot
from ddpdoctor.tui import fmt
from ddpdoctor.tui.lines_view import LinesView
from ddpdoctor.tui.table_model import host_of, should_group

_TIME_WIDTH = 7
_MIN_SPARK = 6


@dataclass(frozen=True)
class Series:
    label: str
    step_times: tuple[float, ...]
    latest: float | None
    work_s: float | None  # data + compute of the last step (the slowest member's, for a host)
    wait_s: float | None  # time in collectives (the least-waiting member's, for a host)
    culprit: bool


@dataclass(frozen=True)
class GraphModel:
    series: tuple[Series, ...]
    high: float  # the shared scale's top: the longest step time shown
    history: int  # the longest history, in steps
    label_width: int = 0


def _work(rv: RankView) -> float | None:
    if rv.data_time_s is None and rv.compute_time_s is None:
        return None
    return (rv.data_time_s or 0.0) + (rv.compute_time_s or 0.0)


def rank_series(rv: RankView, culprit: bool) -> Series:
    latest = rv.step_time_s if rv.step_time_s is not None else (rv.step_times or (None,))[-1]
    return Series(f"r{rv.rank}", rv.step_times, latest, _work(rv), rv.comm_wait_s, culprit)


def host_series(host: str, members: Sequence[RankView], culprits: frozenset[int]) -> Series:
    histories = [rv.step_times for rv in members if rv.step_times]
    depth = min((len(h) for h in histories), default=0)
    # A node is as slow as its slowest rank: element-wise max, aligned on the latest step.
    aligned = [h[len(h) - depth :] for h in histories]
    slowest = tuple(map(max, zip(*aligned, strict=True))) if depth else ()
    works = [w for w in (_work(rv) for rv in members) if w is not None]
    waits = [rv.comm_wait_s for rv in members if rv.comm_wait_s is not None]
    latest_times = [rv.step_time_s for rv in members if rv.step_time_s is not None]
    return Series(
        label=host,
        step_times=slowest,
        latest=max(latest_times) if latest_times else (slowest[-1] if slowest else None),
        work_s=max(works) if works else None,
        wait_s=min(waits) if waits else None,
        culprit=any(rv.rank in culprits for rv in members),
    )


def build_graphs(snapshot: Snapshot) -> GraphModel:
    if not should_group(snapshot):
        series = tuple(rank_series(rv, rv.rank in snapshot.culprits) for rv in snapshot.ranks)
    else:
        by_host: dict[str, list[RankView]] = {}
        for rv in snapshot.ranks:
            by_host.setdefault(host_of(rv), []).append(rv)
        series = tuple(host_series(h, m, snapshot.culprits) for h, m in by_host.items())
    with_data = [s for s in series if s.step_times]
    if not with_data:
        return GraphModel((), 0.0, 0)
    return GraphModel(
        series=series,
        high=max(max(s.step_times) for s in with_data),
        history=max(len(s.step_times) for s in with_data),
        label_width=min(max(len(s.label) for s in series) + 2, 14),
    )


def graph_line(model: GraphModel, index: int, width: int) -> Text:
    s = model.series[index]
    label_w = model.label_width
    bar_w = 8 if width >= 60 else 0
    fixed = label_w + 1 + _TIME_WIDTH + (2 + 5 + bar_w + 6 + bar_w if bar_w else 0)
    # As wide as the longest history (up to the room there is), so the figures follow the lines.
    spark_w = max(min(width - fixed - 1, model.history), _MIN_SPARK)
    out = Text()
    mark = fmt.CULPRIT_MARK if s.culprit else " "
    out.append(
        f"{mark}{fmt.truncate(s.label, label_w - 2):<{label_w - 1}}",
        style=fmt.CULPRIT_STYLE if s.culprit else "bold",
    )
    # One scale from zero for every line: a bar's height compares across ranks.
    out.append(
        fmt.sparkline(s.step_times, spark_w, low=0.0, high=model.high),
        style="red" if s.culprit else "cyan",
    )
    out.append(f" {fmt.step_seconds(s.latest):>{_TIME_WIDTH}}")
    if bar_w:
        scale = (s.work_s or 0.0) + (s.wait_s or 0.0)
        out.append("  work ", style="dim")
        out.append(fmt.level_bar(s.work_s or 0.0, scale, bar_w), style="green")
        out.append(" wait ", style="dim")
        out.append(fmt.level_bar(s.wait_s or 0.0, scale, bar_w), style="yellow")
    return out


class StepGraphs(LinesView):
    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.prepared: GraphModel | None = None  # built on the poll thread for `prepared_for`
        self.prepared_for: Snapshot | None = None
        self.model: GraphModel | None = None
        self._shown: Snapshot | None = None

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        if snapshot is None or snapshot is self._shown:
            return
        self._shown = snapshot
        if self.prepared is not None and self.prepared_for is snapshot:
            self.model = self.prepared
        else:
            self.model = build_graphs(snapshot)
        self._show_model()

    def _show_model(self) -> None:
        model = self.model
        if model is None or not model.series:
            message = "no steps yet" if model is not None else "waiting for the first snapshot"
            self.set_lines(1, lambda _: Text(message, style="dim"))
            return
        self.set_lines(len(model.series), lambda i: graph_line(model, i, self.size.width))

    def on_resize(self) -> None:
        super().on_resize()
        self._show_model()
