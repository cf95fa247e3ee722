"""The header's status line: what the app is doing and how the run stands, in one line."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from rich.text import Text

from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.monitor.tell.diagnosis_text import WAIT_STYLE, busy_wait, wait_line
from ddpdoctor.rank_ranges import named_ranks


def exit_description(returncode: int) -> str:
    """How a process ended, from its Popen return code: "exit code 1", "killed by SIGTERM"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class AppState:
    mode: str  # "run" | "watch"
    snapshot: Snapshot | None
    job_attached: bool
    job_returncode: int | None = None
    stopped_for: str | None = None  # the verdict for which the launcher stopped the job
    poll_error: str | None = None  # "reading the run failed: OSError: ...", while it lasts
    note: str | None = None  # work in progress: "capturing stacks", "stopping the job"

    @property
    def ended(self) -> bool:
        if self.job_attached and self.job_returncode is not None:
            return True
        return self.snapshot is not None and self.snapshot.finished


def ended_verdict(snapshot: Snapshot | None) -> str:
    """The verdict of a run that has ended, in words ("not started" when no rank ever did)."""
    if snapshot is None:
        return "unknown"
    return "not started" if snapshot.never_started else snapshot.verdict.value


def status_line(state: AppState) -> Text:
    """Most urgent first: a read error, work in progress, the end of the run, else live."""
    status = Text(" ")
    status.append(state.mode, style="bold")
    snapshot = state.snapshot
    if state.poll_error:
        status.append(f" · {state.poll_error}", style="bold red")
        status.append(" (retrying)", style="dim")
    elif state.note:
        status.append(f" · {state.note}", style="bold yellow")
    elif state.ended:
        verdict = ended_verdict(snapshot)
        if state.job_attached and state.job_returncode is not None:
            how = exit_description(state.job_returncode)
            status.append(f" · the job has ended ({how}): {verdict}", style="bold")
            if state.stopped_for:
                status.append(f" · ddpdoctor stopped it after the {state.stopped_for}")
        elif state.mode == "watch":
            status.append(f" · post-mortem: the run has finished: {verdict}", style="bold")
        else:
            status.append(f" · every rank has finished: {verdict}", style="bold")
        status.append(" · final state kept on screen, q to quit", style="dim")
    elif snapshot is None:
        status.append(" · connecting", style="dim")
    else:
        status.append(" · live", style="green")
        wait = busy_wait(snapshot)
        if wait is not None and not snapshot.verdict.is_problem:
            status.append(f" · {wait_line(wait)}", style=WAIT_STYLE.get(wait.severity or "", ""))
        if snapshot.nodes_missing:
            status.append(
                f" · waiting for {named_ranks(snapshot.nodes_missing, 'node')} to join",
                style="yellow",
            )
        if state.mode == "watch":
            status.append(" · quitting leaves the job alone", style="dim")
    return status
