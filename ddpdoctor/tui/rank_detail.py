"""The detail of one rank (Enter on its row): what it did last, its collectives, its logs, its stack.

It follows the app's snapshot while open, so a rank that moves on (or dies) updates in place.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ddpdoctor.monitor.model.snapshot import RankView, Snapshot
from ddpdoctor.tui import fmt
from ddpdoctor.tui.panels import log_line_text, stack_group_text
from ddpdoctor.tui.table_model import collective_text

MAX_RANK_LOG_LINES = 40
MAX_RECENT = 6  # recent collectives in the summary


def _field(out: Text, label: str, value: str, style: str = "") -> None:
    out.append(f"\n{label:>13}  ", style="dim")
    out.append(value, style=style)


def _events_summary(out: Text, rv: RankView, total: int | None) -> None:
    _field(out, "state", fmt.state_label(rv.state), fmt.state_style(rv.state))
    _field(out, "host / pid", f"{rv.host or '?'} / {rv.pid if rv.pid is not None else '?'}")
    if rv.local_rank is not None:
        _field(out, "local rank", str(rv.local_rank))
    _field(out, "phase", rv.phase or fmt.NONE)
    step = fmt.steps(rv.step, rv.total_steps or total)
    _field(out, "epoch / step", f"{rv.epoch if rv.epoch is not None else fmt.NONE} / {step}")
    _field(out, "last event", rv.last_event or fmt.NONE)
    if rv.fault:
        _field(out, "injected fault", rv.fault, "bold magenta")
    _field(out, "heartbeat age", fmt.duration(rv.heartbeat_age_s))
    if rv.activity is not None:
        since = fmt.duration(rv.activity.since_s)
        _field(out, "activity", f"{rv.activity.describe()} for {since}")
    if rv.step_time_s is not None:
        parts = [f"step {fmt.step_seconds(rv.step_time_s)}"]
        for name, value in (
            ("data", rv.data_time_s),
            ("compute", rv.compute_time_s),
            ("comm wait", rv.comm_wait_s),
        ):
            if value is not None:
                parts.append(f"{name} {fmt.step_seconds(value)}")
        _field(out, "timings", " · ".join(parts))
    if rv.samples_per_s is not None or rv.loss is not None:
        _field(
            out, "throughput", f"{fmt.rate(rv.samples_per_s)} samples/s · loss {fmt.loss(rv.loss)}"
        )
    if rv.collective is not None:
        style = "yellow" if rv.collective.waiting_s >= 1 else ""
        waited = fmt.duration(rv.collective.waiting_s)
        _field(out, "in collective", f"{rv.collective.describe()} for {waited}", style)
    if rv.waiting_on:
        _field(out, "waiting on", f"rank {fmt.ranks_text(rv.waiting_on)}", "bold red")
    if rv.group_seqs:
        seqs = ", ".join(f"{group} #{seq}" for group, seq in rv.group_seqs)
        _field(out, "last seq", f"{seqs} ({rv.collectives_done} collectives done)")
    if rv.recent_collectives:
        recent = " → ".join(f"{c.op} #{c.seq}" for c in rv.recent_collectives[-MAX_RECENT:])
        _field(out, "recent", recent)
    if rv.state.finished:
        text, style = collective_text(rv)
        if rv.exit_reason:
            text += f" ({rv.exit_reason})"
        _field(out, "ended", text, style or "dim")
    for code, message in rv.warnings:
        _field(out, "warning", f"{code}: {message}", "yellow")
    if rv.rss_bytes is not None:
        _field(out, "memory", f"{rv.rss_bytes / 2**20:.0f} MiB RSS")
    if rv.traceback:
        out.append("\n\ntraceback\n", style="bold red")
        out.append(rv.traceback.rstrip(), style="red")


def rank_detail_text(snapshot: Snapshot | None, rank: int) -> Text:
    if snapshot is None:
        return Text("waiting for the first snapshot", style="dim")
    rv = next((r for r in snapshot.ranks if r.rank == rank), None)
    out = Text()
    is_culprit = rank in snapshot.culprits
    out.append(f" rank {rank} ", style=fmt.CULPRIT_STYLE if is_culprit else "bold reverse")
    if is_culprit:
        out.append("  culprit of the current diagnosis", style="bold red")
    if rv is None:
        out.append("\nthis rank is not in the snapshot", style="dim")
        return out
    _events_summary(out, rv, snapshot.run.total_steps)
    groups = [g for g in snapshot.stacks if rank in g.ranks]
    out.append("\n\nstack\n", style="bold")
    if groups:
        for group in groups:
            out.append_text(stack_group_text(group, snapshot.culprits, limit=None))
    else:
        out.append("none captured (press c on the main screen to capture)", style="dim")
    lines = [line for line in snapshot.logs if line.rank == rank][-MAX_RANK_LOG_LINES:]
    out.append("\n\nlog lines\n", style="bold")
    if lines:
        out.append_text(Text("\n").join(log_line_text(line, wrap=True) for line in lines))
    else:
        out.append("none yet", style="dim")
    return out


class RankDetailScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "close", "Close"),
    ]

    def __init__(self, rank: int) -> None:
        super().__init__(id="rank-detail")
        self.rank = rank

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="rank-detail-box") as box:
            box.border_title = f"rank {self.rank}"
            box.border_subtitle = "esc to close"
            yield Static(id="rank-detail-body")

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._show, init=True)

    def _show(self, snapshot: Snapshot | None) -> None:
        self.query_one("#rank-detail-body", Static).update(rank_detail_text(snapshot, self.rank))

    def action_close(self) -> None:
        self.dismiss(None)
