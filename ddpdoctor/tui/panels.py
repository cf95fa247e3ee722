"""The diagnosis, stacks and logs panels: each a Static re-rendered only when its part of the snapshot changes."""

from __future__ import annotations

import re

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ddpdoctor.findings import sort_findings
from ddpdoctor.monitor.model.snapshot import LogLine, Snapshot, StackGroup, Verdict
from ddpdoctor.stacks.groups import is_marker
from ddpdoctor.tui import fmt
from ddpdoctor.tui.lines_view import LinesView
from ddpdoctor.tui.log_filter import LogFilter
from ddpdoctor.tui.pipeline_text import pipeline_text

MAX_FRAMES = 6  # innermost frames per stack class in the panel (the rank detail shows them all)
MAX_LOG_LINES = 300
_SOURCE_WIDTH = 16


def diagnosis_text(snapshot: Snapshot | None) -> Text:
    if snapshot is None:
        return Text("waiting for the first snapshot", style="dim")
    out = Text()
    out.append_text(fmt.verdict_badge(snapshot))
    if snapshot.detected_after_s is not None:
        out.append(f" detected after {fmt.duration(snapshot.detected_after_s)}")
    if snapshot.culprits:
        label = "rank" if len(snapshot.culprits) == 1 else "ranks"
        out.append(" · culprit ")
        out.append(f"{label} {fmt.ranks_text(snapshot.culprits)}", style="bold red")
    if snapshot.finished:
        out.append(" · run finished", style="dim")
    if snapshot.thresholds is not None and not snapshot.finished:
        out.append(f" · hang after {fmt.duration(snapshot.thresholds.hang_after_s)}", style="dim")
    findings = sort_findings(snapshot.findings)
    pipeline = pipeline_text(snapshot)
    if not findings:
        if snapshot.verdict is Verdict.HEALTHY:
            out.append("\nNo problems found.", style="green")
        elif snapshot.verdict is Verdict.RUNNING:
            out.append("\nNo problems found so far.", style="dim")
        if pipeline is not None:
            out.append_text(pipeline)
        return out
    for finding in findings:
        mark, style = fmt.severity_mark(finding.severity)
        out.append(f"\n{mark} ", style=style)
        out.append(finding.id, style="bold")
        out.append(f"  {finding.summary}")
        if finding.ranks:
            out.append(f"\n    ranks {fmt.ranks_text(finding.ranks)}", style="bold red")
        if finding.fix:
            out.append("\n    fix: ", style="bold green")
            out.append(finding.fix)
        for evidence in finding.evidence[:2]:
            where = evidence.file or ""
            if evidence.line is not None:
                where += f":{evidence.line}"
            out.append(f"\n    {where + '  ' if where else ''}{evidence.text}", style="dim")
    if pipeline is not None:
        out.append_text(pipeline)
    return out


def stack_group_text(group: StackGroup, culprits: frozenset[int], *, limit: int | None) -> Text:
    out = Text()
    is_culprit = bool(culprits.intersection(group.ranks))
    count = len(group.ranks)
    out.append(
        f"ranks {fmt.ranks_text(group.ranks)} ({count} rank{'s' if count != 1 else ''})",
        style=fmt.CULPRIT_STYLE if is_culprit else "bold",
    )
    if group.thread:
        out.append(f" · {group.thread}", style="dim")
    frames = group.frames if limit is not None else (group.full_frames or group.frames)
    shown = frames[-limit:] if limit is not None else frames
    if len(shown) < len(frames):
        out.append(f"\n   ⋮ {len(frames) - len(shown)} outer frames", style="dim")
    for i, frame in enumerate(shown):
        innermost = i == len(shown) - 1
        out.append("\n   ")
        if is_marker(frame):
            out.append(frame, style="dim")
            continue
        if limit is None:
            out.append(frame, style="bold yellow" if innermost else "")
            continue
        function, where = split_frame(frame)
        out.append(function, style="bold yellow" if innermost else "bold")
        if where:
            out.append(f"  {where}", style="dim")
    return out


_LOCATED_FRAME = re.compile(r"^(?P<where>\S+:\d+) (?P<function>.+)$")


def split_frame(frame: str) -> tuple[str, str]:
    """ "dir/file.py:12 function" -> ("function", "file.py:12"): the name first, for narrow panels.

    Anything else (a native frame "clock_nanosleep (libc.so.6)") is kept whole.
    """
    match = _LOCATED_FRAME.match(frame)
    if not match:
        return frame, ""
    return match.group("function"), match.group("where").rsplit("/", 1)[-1]


def stacks_text(snapshot: Snapshot | None) -> Text:
    if snapshot is None:
        return Text("waiting for the first snapshot", style="dim")
    out = Text()
    if snapshot.stack_status:
        out.append(snapshot.stack_status, style="italic")
    elif not snapshot.stacks and (snapshot.finished or not snapshot.live):
        out.append("no stacks were captured while the run was alive", style="dim")
    elif not snapshot.stacks:
        out.append(
            "no stacks captured yet: press c to capture py-spy stacks of every rank", style="dim"
        )
    # The culprits' stacks first: in a short panel they are the ones to see.
    groups = sorted(snapshot.stacks, key=lambda g: not snapshot.culprits.intersection(g.ranks))
    for group in groups:
        if out:
            out.append("\n")
        out.append_text(stack_group_text(group, snapshot.culprits, limit=MAX_FRAMES))
    out.append_text(flight_recorder_text(snapshot))
    return out


def flight_recorder_text(snapshot: Snapshot) -> Text:
    """Each rank's backend, from its flight-recorder dump (asked with b, or by the monitor when
    a rank stops making progress); empty until a dump was asked for."""
    out = Text()
    if not snapshot.flight_recorder and not snapshot.fr_status:
        return out
    out.append("\nflight recorder", style="bold")
    if snapshot.fr_status:
        out.append(f" ({snapshot.fr_status})", style="italic")
    for dump in snapshot.flight_recorder:
        style = "bold red" if dump.rank in snapshot.culprits else ""
        out.append(f"\n  rank {dump.rank}: ", style=style)
        out.append(dump.summary(), style="dim" if dump.error else "")
    return out


def log_line_text(line: LogLine, *, wrap: bool = False) -> Text:
    out = Text(no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    if line.level == "error":
        out.append("✗ ", style="bold red")
    elif line.level == "warn":
        out.append("! ", style="bold yellow")
    else:
        out.append("  ")
    out.append(f"{fmt.truncate(line.source, _SOURCE_WIDTH):<{_SOURCE_WIDTH}} ", style="dim")
    if line.finding_id:
        out.append(f"◆ {line.finding_id} ", style="bold cyan")
    out.append(line.text, style=fmt.LEVEL_STYLES.get(line.level, ""))
    return out


def filtered_logs(lines: tuple[LogLine, ...], log_filter: LogFilter) -> list[LogLine]:
    return log_filter.apply(lines)[-MAX_LOG_LINES:]


class SnapshotStatic(Static):
    """A Static that re-renders only when the part of the snapshot it shows has changed."""

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown_key: object = object()

    def view_key(self, snapshot: Snapshot | None) -> object:
        return snapshot

    def build(self, snapshot: Snapshot | None) -> Text:
        raise TypeError(f"{type(self).__name__} must override build()")

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        self.rerender()

    def rerender(self, *, force: bool = False) -> None:
        key = self.view_key(self.snapshot)
        if not force and key == self._shown_key:
            return
        self._shown_key = key
        self.update(self.build(self.snapshot))


class DiagnosisView(SnapshotStatic):
    def view_key(self, snapshot: Snapshot | None) -> object:
        if snapshot is None:
            return None
        return (
            snapshot.verdict,
            snapshot.findings,
            snapshot.culprits,
            snapshot.detected_after_s,
            snapshot.finished,
            tuple((v.pipeline, v.state, v.collective) for v in snapshot.ranks if v.pipeline),
        )

    def build(self, snapshot: Snapshot | None) -> Text:
        return diagnosis_text(snapshot)


class StacksView(SnapshotStatic):
    def view_key(self, snapshot: Snapshot | None) -> object:
        if snapshot is None:
            return None
        return (
            snapshot.stacks,
            snapshot.stack_status,
            snapshot.culprits,
            snapshot.flight_recorder,
            snapshot.fr_status,
        )

    def build(self, snapshot: Snapshot | None) -> Text:
        return stacks_text(snapshot)


class LogsView(LinesView):
    """The run's recent log lines, newest last, following the tail unless scrolled up."""

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.log_filter = LogFilter()
        self.shown: list[LogLine] = []
        self._key: object = object()

    def set_filter(self, log_filter: LogFilter) -> None:
        self.log_filter = log_filter
        self.rerender()

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        self.rerender()

    def rerender(self) -> None:
        snapshot = self.snapshot
        key = (snapshot.logs if snapshot is not None else None, self.log_filter)
        if key == self._key:
            return
        self._key = key
        if snapshot is None:
            self.shown = []
            self.set_lines(1, lambda _: Text("waiting for the first snapshot", style="dim"))
            return
        shown = self.shown = filtered_logs(snapshot.logs, self.log_filter)
        if not shown:
            hint = (
                "no log lines yet"
                if not snapshot.logs
                else f"no lines match: {self.log_filter.describe()}"
            )
            self.set_lines(1, lambda _: Text(hint, style="dim"))
            return
        self.set_lines(len(shown), lambda i: log_line_text(shown[i]), follow=True)

    def plain_text(self) -> str:
        return "\n".join(self.line_text(i).plain for i in range(self.line_count))
