"""HeadlessView: the text view of a run, for `--no-tui`, pipes and CI logs.

On a terminal (`live=True`) a progress bar per rank (per host beyond 16 ranks) redraws in place
while the job's own output scrolls above it; otherwise a status line every few seconds. When a
hang, mismatch or crash is diagnosed the diagnosis is printed at once (verdict, culprit ranks and
where they are, findings with fixes); stacks follow as soon as py-spy has them; `close()` prints
the final verdict and whatever was not printed yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.text import Text

from ddpdoctor.console import Sanitized, Verbatim, symbols_for
from ddpdoctor.findings import Severity
from ddpdoctor.monitor.judge.rules import fmt_s
from ddpdoctor.monitor.judge.rules.wait import FINDING_ID as WAIT_FINDING
from ddpdoctor.monitor.model.snapshot import RankView, Snapshot
from ddpdoctor.monitor.tell.diagnosis_text import (
    diagnosis_lines,
    finding_lines,
    headline_finding,
    stack_lines,
    status_line,
    verdict_line,
)

STATUS_EVERY_S = 5.0
# Findings worth a line as soon as they appear, while the job runs (the network's names).
SAID_AT_ONCE = frozenset(
    {"network.name_unresolved", "network.name_changed", "collective.chance_pairing"}
)
MAX_BARS = 16


class HeadlessView:
    def __init__(
        self,
        console: Console,
        *,
        live: bool,
        status_every_s: float = STATUS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.live = live
        self.status_every_s = status_every_s
        self.clock = clock
        self.symbols = symbols_for(console.file)
        self._last_status: float | None = None
        self._printed_problem: tuple | None = None
        self._printed_findings: set[tuple[str, str]] = set()
        self._printed_stacks = False
        self._printed_waits: set[tuple] = set()
        self._progress: Progress | None = None
        self._live: Live | None = None
        self._tasks: dict[str, TaskID] = {}
        self._status = Text("")
        self._closed = False
        self._shown_launchers: set[tuple[str | None, int, tuple[int, ...]]] = set()

    # -- output of the job -----------------------------------------------------------------

    def job_output(self, line: str) -> None:
        """A line of the job's own output, passed through unchanged."""
        if self.live:  # above the bars: only the console knows where they are
            self.console.print(Verbatim(line.rstrip("\n")), soft_wrap=True)
            return
        # Straight to the stream: a job that prints every step of a millisecond would otherwise
        # spend ~80 µs of this process's CPU per line in rich's rendering, on the ranks' cores.
        stream = self.console.file
        stream.write(line.rstrip("\n") + "\n")
        stream.flush()

    # -- updates ---------------------------------------------------------------------------

    def update(self, snap: Snapshot) -> None:
        if self._closed:
            return
        self._print_launchers(snap)
        if self.live:
            self._update_bars(snap)
        else:
            now = self.clock()
            if self._last_status is None or now - self._last_status >= self.status_every_s:
                self._last_status = now
                self._print(status_line(snap), markup=False)
        if snap.verdict.is_problem:
            self._print_problem(snap)
        else:
            self._print_waits(snap)

    def close(self, snap: Snapshot) -> None:
        """The final verdict, the findings not printed yet with their fixes, the stacks."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._update_bars(snap)
            self._live.stop()
            self._live = None
        self._print_launchers(snap, final=True)
        if snap.verdict.is_problem and self._printed_problem is None:
            for line in diagnosis_lines(snap, self.symbols):
                self._print(line)
            return
        # The reason of an ending without a problem found is the headline: said once, there.
        reason = headline_finding(snap)
        for finding in snap.findings:
            key = (finding.id, finding.summary)
            if key not in self._printed_findings and finding is not reason:
                self._printed_findings.add(key)
                for line in finding_lines(finding, self.symbols):
                    self._print(line)
        if snap.stacks and not self._printed_stacks:
            self._printed_stacks = True
            for line in stack_lines(snap.stacks, snap.culprits):
                self._print(line)
        self._print(verdict_line(snap))
        if reason is not None and reason.fix and reason.severity is not Severity.INFO:
            fix = Text("  fix: ", style="bold")
            fix.append(reason.fix)
            self._print(fix)

    # -- internals -------------------------------------------------------------------------

    def _print_launchers(self, snap: Snapshot, *, final: bool = False) -> None:
        """Each launcher once: what started the ranks (an mp.spawn parent, torchrun's agent,
        slurmstepd), printed when every rank of the world has said hello, or at the end."""
        complete = sum(len(launcher.ranks) for launcher in snap.launchers) >= len(snap.ranks)
        for launcher in snap.launchers:
            # a launcher whose processes have not all joined is worth a line at once
            key = (launcher.host, launcher.pid, launcher.not_joined or ())
            if (complete or final or launcher.not_joined) and key not in self._shown_launchers:
                self._shown_launchers.add(key)
                self._print(f"launcher: {launcher.describe()}", markup=False)

    def _print(self, line: Text | str, *, markup: bool = False) -> None:
        # markup off: the lines carry text from the job (a `[link=...]` of theirs stays text).
        # soft_wrap: long lines stay whole (a terminal wraps them; a CI log keeps them greppable)
        self.console.print(line, soft_wrap=True, highlight=False, markup=markup)

    def _print_waits(self, snap: Snapshot) -> None:
        """A wait for a busy rank, once as it becomes a warning and once as an error (the
        status line shows it all along): not a hang, but worth a line in the log."""
        for finding in snap.findings:
            if (
                finding.id in SAID_AT_ONCE
                and (finding.id, finding.summary) not in self._printed_findings
            ):
                self._printed_findings.add((finding.id, finding.summary))
                for line in finding_lines(finding, self.symbols):
                    self._print(line)
                continue
            if finding.id != WAIT_FINDING or finding.severity is Severity.INFO:
                continue
            key = (finding.severity, finding.ranks)
            if key not in self._printed_waits:
                self._printed_waits.add(key)
                for line in finding_lines(finding, self.symbols):
                    self._print(line)

    def _print_problem(self, snap: Snapshot) -> None:
        key = (snap.verdict, snap.culprits)
        if self._printed_problem != key:
            self._printed_problem = key
            self._printed_stacks = bool(snap.stacks)
            lines = diagnosis_lines(snap, self.symbols)
            self._printed_findings.update((f.id, f.summary) for f in snap.findings)
            for line in lines:
                self._print(line)
        elif snap.stacks and not self._printed_stacks:
            self._printed_stacks = True
            for line in stack_lines(snap.stacks, snap.culprits):
                self._print(line)

    def _update_bars(self, snap: Snapshot) -> None:
        if self._progress is None:
            self._progress = Progress(
                # markup off: labels hold host names the ranks reported
                TextColumn("{task.description}", justify="right", markup=False),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}", markup=False),
                console=self.console,
                auto_refresh=False,
            )
            self._live = Live(
                Sanitized(Group(self._progress, self._status)),
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()
        progress = self._progress
        rows = _bar_rows(snap)
        for key, (label, done, total, info) in rows.items():
            task = self._tasks.get(key)
            if task is None:
                task = self._tasks[key] = progress.add_task(label, total=total, info=info)
            progress.update(task, completed=done, total=total, info=info, description=label)
        self._status.truncate(0)
        self._status.append(status_line(snap))
        if self._live is not None:
            self._live.refresh()


def _bar_rows(snap: Snapshot) -> dict[str, tuple[str, int, int | None, str]]:
    """Per rank (or per host when there are many): label, steps done, total, a short status."""
    rows: dict[str, tuple[str, int, int | None, str]] = {}
    if len(snap.ranks) <= MAX_BARS:
        for view in snap.ranks:
            rows[str(view.rank)] = (
                f"rank {view.rank}",
                view.step or 0,
                view.total_steps,
                _rank_info(view),
            )
        return rows
    by_host: dict[str, list[RankView]] = {}
    for view in snap.ranks:
        by_host.setdefault(view.host or "?", []).append(view)
    for host, views in sorted(by_host.items())[:MAX_BARS]:
        steps = [v.step or 0 for v in views]
        worst = sorted({v.state.value for v in views})
        rows[host] = (
            f"{host} ({len(views)})",
            min(steps),
            views[0].total_steps,
            f"steps {min(steps)}-{max(steps)} · {', '.join(worst)}",
        )
    return rows


def _rank_info(view: RankView) -> str:
    bits = [view.state.value]
    if view.step_time_s is not None:
        bits.append(f"{view.step_time_s:.3f} s/step")
    if view.loss is not None:
        bits.append(f"loss {view.loss:.4g}")
    if view.collective is not None and view.collective.waiting_s >= 1.0:
        bits.append(
            f"{view.collective.op} #{view.collective.seq} {fmt_s(view.collective.waiting_s)}"
        )
    if view.error:
        bits.append(view.error[:60])
    return " · ".join(bits)
