"""The header: what run this is, how long it has run, the verdict badge, and one status line."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.tui import fmt


def hosts_text(hosts: tuple[str, ...], limit: int = 2) -> str:
    if not hosts:
        return "host ?"
    if len(hosts) > limit:
        return f"{len(hosts)} hosts"
    return ", ".join(hosts)


def launchers_text(snapshot: Snapshot) -> str:
    """What started the ranks (they are no ranks): "started by python multigpu.py 4 2"."""
    launchers = snapshot.launchers
    if not launchers:
        return ""
    waiting = sum(len(launcher.not_joined or ()) for launcher in launchers)
    suffix = f" ({waiting} of its processes not joined)" if waiting else ""
    if len(launchers) == 1:
        return f"started by {launchers[0].label}{suffix}"
    return f"started by {len(launchers)} launchers{suffix}"


def verdict_badge(snapshot: Snapshot | None) -> Text:
    if snapshot is None:
        return Text(" CONNECTING ", style="bold black on grey70")
    return fmt.verdict_badge(snapshot)


def title_line(snapshot: Snapshot | None, title: str | None) -> Text:
    line = Text()
    line.append(" ddpdoctor ", style="bold")
    if snapshot is None:
        line.append(f"│ {title or 'waiting for the first snapshot'}", style="dim")
        return line
    run = snapshot.run
    line.append("│ ", style="dim")
    line.append(title or run.name, style="bold cyan")
    world = run.world_size if run.world_size is not None else len(snapshot.ranks)
    hosts = run.hosts or tuple(dict.fromkeys(rv.host for rv in snapshot.ranks if rv.host))
    line.append(" │ ", style="dim")
    line.append(f"{world} ranks · {run.backend or 'backend ?'} · {hosts_text(hosts)}")
    launchers = launchers_text(snapshot)
    if launchers:
        line.append(f" · {launchers}", style="dim")
    line.append(" │ ", style="dim")
    line.append(fmt.clock(snapshot.elapsed_s))
    if snapshot.attempts is not None:  # a job its launcher restarts after a failure
        line.append(" │ ", style="dim")
        line.append(
            snapshot.attempts.label(), style="bold yellow" if snapshot.attempts.number > 1 else ""
        )
    return line


class RunHeader(Widget):
    """Two lines: run facts and the verdict badge; then the app's status line (mode, end, errors)."""

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)
    status: reactive[Text] = reactive(Text, always_update=True)

    def __init__(self, *, title: str | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run_title = title

    def render(self) -> RenderableType:
        grid = Table.grid(expand=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(justify="right", no_wrap=True)
        grid.add_row(title_line(self.snapshot, self.run_title), verdict_badge(self.snapshot))
        grid.add_row(self.status, "")
        return grid
