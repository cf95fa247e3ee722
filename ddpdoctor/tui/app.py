"""The live view of a DDP run: a Textual app fed only by snapshots from a source.

Data flow (memray's live TUI, Toolong's latest-wins messages): a timer wakes the poll thread; the
thread polls the source and posts one SnapshotReady; the handler sets `app.snapshot`; each view
holds the snapshot as a reactive and updates only what changed. Nothing on the event loop touches
files, processes or py-spy: stack captures and stopping the job run in thread workers, bounded in
time, and any failure becomes a notification and a status line, never a crash.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import ClassVar, Literal

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Footer
from textual.worker import Worker, WorkerState

from ddpdoctor.console import sanitize
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.tui.dialogs import LogFilterScreen, QuitRunScreen
from ddpdoctor.tui.graphs import StepGraphs
from ddpdoctor.tui.header import RunHeader
from ddpdoctor.tui.log_filter import LogFilter
from ddpdoctor.tui.messages import PollFailed, SnapshotReady
from ddpdoctor.tui.panels import DiagnosisView, LogsView, StacksView
from ddpdoctor.tui.poller import SnapshotPoller, call_with_timeout, describe_error
from ddpdoctor.tui.protocols import JobHandle, SnapshotSource
from ddpdoctor.tui.rank_detail import RankDetailScreen
from ddpdoctor.tui.ranks_table import RanksTable
from ddpdoctor.tui.status import AppState, ended_verdict, status_line
from ddpdoctor.tui.view_model import PreparedView, prepare_view

Mode = Literal["run", "watch"]

DEFAULT_REFRESH_S = 0.25
STACKS_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 30.0

PANELS = {
    "graphs": "#graphs-panel",
    "diagnosis": "#diagnosis-panel",
    "stacks": "#stacks-panel",
    "logs": "#logs-panel",
}


class DdpDoctorApp(App[Snapshot | None]):
    CSS_PATH = Path(__file__).with_name("ddpdoctor.tcss")
    TITLE = "ddpdoctor"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
        Binding("enter", "open_selected", "Detail"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("c", "capture_stacks", "Stacks now"),
        Binding("b", "ask_flight_recorder", "Backend (FR)", show=False),
        Binding("f", "filter_logs", "Filter"),
        Binding("w", "cycle_level", "Level"),
        Binding("r", "filter_selected_rank", "Rank logs"),
        Binding("g", "toggle_panel('graphs')", "Graphs"),
        Binding("d", "toggle_panel('diagnosis')", "Diagnosis"),
        Binding("k", "toggle_panel('stacks')", "Stacks"),
        Binding("l", "toggle_panel('logs')", "Logs"),
    ]

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)
    job_returncode: reactive[int | None] = reactive(None)
    stopped_for: reactive[str | None] = reactive(None)
    poll_error: reactive[str | None] = reactive(None)
    note: reactive[str | None] = reactive(None)  # transient state: "stopping the job", ...

    def __init__(
        self,
        source: SnapshotSource,
        *,
        mode: Mode = "watch",
        job: JobHandle | None = None,
        title: str | None = None,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        if mode not in ("run", "watch"):
            raise ValueError(f"mode must be 'run' or 'watch', not {mode!r}")
        super().__init__()
        self.source = source
        self.mode: Mode = mode
        self.job = job
        self.run_title = sanitize(title) if title is not None else None
        self.refresh_s = refresh_s
        self.stacks_timeout_s = STACKS_TIMEOUT_S
        self.stop_timeout_s = STOP_TIMEOUT_S
        self.poller = SnapshotPoller(source, self.post_message, job=job, prepare=self._prepare)
        self.applied = 0  # snapshots applied so far
        self.apply_times: deque[float] = deque(maxlen=10_000)  # seconds per apply (benchmarks)
        self._serial = 0
        self._ended_notified = False
        self._last_error_notified: str | None = None

    # ---- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        # Kept as attributes: App.query_one searches the active screen, which may be a dialog.
        self.header = RunHeader(title=self.run_title, id="header")
        self.table = RanksTable(id="ranks")
        self.graphs = StepGraphs(id="graphs-panel", classes="panel")
        self.graphs.border_title = "step time per rank, shared scale · work = data + compute"
        self.diagnosis = DiagnosisView(id="diagnosis")
        self.stacks = StacksView(id="stacks")
        self.logs = LogsView(id="logs-panel", classes="panel")
        self.logs.border_title = "logs · all lines"
        yield self.header
        with Vertical(id="body"):
            yield self.table
            yield self.graphs
            with Horizontal(id="middle"):
                with VerticalScroll(id="diagnosis-panel", classes="panel") as diagnosis:
                    diagnosis.border_title = "diagnosis"
                    yield self.diagnosis
                with VerticalScroll(id="stacks-panel", classes="panel") as stacks:
                    stacks.border_title = "stacks (c: capture now)"
                    yield self.stacks
            yield self.logs
        yield Footer()

    def on_mount(self) -> None:
        self._views = [self.header, self.table, self.graphs, self.diagnosis, self.stacks, self.logs]
        self.table.focus()
        self._update_status()
        self.poller.start()
        self.set_interval(self.refresh_s, self.poller.wake)

    def on_unmount(self) -> None:
        self.poller.stop()

    # ---- snapshots in -------------------------------------------------------------------
    def _prepare(self, snapshot: Snapshot) -> PreparedView:
        """On the poll thread: the view models for the settings the table has right now."""
        return prepare_view(snapshot, self.table.settings)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self.poller.ack()
        if message.serial <= self._serial:
            return  # a newer one was applied already
        self._serial = message.serial
        started = time.perf_counter()
        prepared = message.prepared
        if isinstance(prepared, PreparedView):
            self.table.prepared = prepared
            self.graphs.prepared, self.graphs.prepared_for = prepared.graphs, prepared.snapshot
        try:
            with self.batch_update():
                self.poll_error = None
                self.job_returncode = message.job_returncode
                self.stopped_for = message.stopped_for
                self.snapshot = message.snapshot
        except Exception as exc:  # noqa: BLE001 - a snapshot the views cannot show must not end the app
            self._report_error(f"showing the run failed: {describe_error(exc)}")
            return
        self.apply_times.append(time.perf_counter() - started)
        self.applied += 1

    def on_poll_failed(self, message: PollFailed) -> None:
        self.poller.ack()
        if message.serial <= self._serial:
            return
        self._serial = message.serial
        self._report_error(f"reading the run failed: {message.error}")

    def _report_error(self, error: str) -> None:
        error = sanitize(error)
        self.poll_error = error
        if error != self._last_error_notified:
            self._last_error_notified = error
            self.notify(
                f"{error}\nThe last good state stays on screen; polling goes on.",
                title="ddpdoctor could not update the view",
                severity="error",
                timeout=8,
                markup=False,
            )

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        for view in getattr(self, "_views", ()):
            view.snapshot = snapshot
        self._update_status()

    def watch_job_returncode(self, returncode: int | None) -> None:
        self._update_status()

    def watch_poll_error(self, error: str | None) -> None:
        self._update_status()

    def watch_note(self, note: str | None) -> None:
        self._update_status()

    @property
    def state(self) -> AppState:
        return AppState(
            mode=self.mode,
            snapshot=self.snapshot,
            job_attached=self.job is not None,
            job_returncode=self.job_returncode,
            stopped_for=self.stopped_for,
            poll_error=self.poll_error,
            note=self.note,
        )

    @property
    def ended(self) -> bool:
        return self.state.ended

    def _update_status(self) -> None:
        if not hasattr(self, "_views"):
            return
        state = self.state
        self.header.status = status_line(state)
        if state.ended:
            self._notify_ended(ended_verdict(state.snapshot))

    def _notify_ended(self, verdict: str) -> None:
        if self._ended_notified or self.mode != "run":
            return
        self._ended_notified = True
        self.notify(
            f"The job has ended: {verdict}. Its final state stays on screen until you quit.",
            title="Job ended",
            severity="error"
            if verdict in ("hang", "mismatch", "crash", "not started")
            else "information",
            timeout=10,
            markup=False,
        )

    # ---- actions ------------------------------------------------------------------------
    async def action_quit(self) -> None:
        self.request_quit()

    def request_quit(self) -> None:
        """watch: leave the job alone. run: ask first, then stop the job (unless it has ended)."""
        if self.mode == "watch" or self.job is None or self.ended:
            self.exit(self.snapshot)
            return
        if isinstance(self.screen, QuitRunScreen):
            return
        self.push_screen(QuitRunScreen(), self._quit_answer)

    def _quit_answer(self, stop: bool | None) -> None:
        if not stop or self.job is None:
            return
        self.note = "stopping the job"
        self.run_worker(
            partial(call_with_timeout, self.job.stop, self.stop_timeout_s, "stopping the job"),
            name="stop-job",
            group="stop",
            thread=True,
            exit_on_error=False,
        )

    def action_capture_stacks(self) -> None:
        if any(w.group == "stacks" and w.is_running for w in self.workers):
            self.notify("A stack capture request is still running.", timeout=3, markup=False)
            return
        self._show_panel("stacks")
        self.note = "capturing stacks"
        self.run_worker(
            partial(
                call_with_timeout,
                self.source.request_stacks,
                self.stacks_timeout_s,
                "stack capture",
            ),
            name="request-stacks",
            group="stacks",
            thread=True,
            exit_on_error=False,
        )

    def action_ask_flight_recorder(self) -> None:
        """Ask every rank for its flight-recorder dump (which collective its backend has
        scheduled and completed); the answers land in the stacks panel within a heartbeat."""
        ask = getattr(self.source, "request_flight_recorder", None)
        if ask is None:
            self.notify("This view cannot ask the ranks.", timeout=3, markup=False)
            return
        self._show_panel("stacks")
        self.run_worker(
            partial(call_with_timeout, ask, self.stacks_timeout_s, "flight recorder request"),
            name="request-flight-recorder",
            group="flight-recorder",
            thread=True,
            exit_on_error=False,
        )
        self.notify(
            "Flight-recorder dumps requested; they appear in the stacks panel.",
            timeout=3,
            markup=False,
        )

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker, state = event.worker, event.state
        if worker.group == "stacks" and state in (WorkerState.SUCCESS, WorkerState.ERROR):
            self.note = None
            if state is WorkerState.ERROR:
                self.notify(
                    describe_error(worker.error) if worker.error else "unknown error",
                    title="Stack capture failed",
                    severity="error",
                    timeout=8,
                    markup=False,
                )
            elif worker.result is False:  # the monitor says a capture is already under way
                self.notify(
                    "A capture is already running; its stacks appear when it finishes.",
                    timeout=4,
                    markup=False,
                )
            else:
                self.notify(
                    "Stacks requested; they appear in the stacks panel.", timeout=3, markup=False
                )
        elif worker.group == "stop" and state in (WorkerState.SUCCESS, WorkerState.ERROR):
            if state is WorkerState.ERROR:
                # The launcher still kills the job's process group on its way out.
                self.notify(
                    describe_error(worker.error) if worker.error else "unknown error",
                    title="Stopping the job failed",
                    severity="error",
                    markup=False,
                )
            self.exit(self.snapshot)

    def action_cycle_sort(self) -> None:
        self.table.cycle_sort()

    def action_open_selected(self) -> None:
        table = self.table
        key = table.selected_key()
        if key is not None:
            self._open_row(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self._open_row(event.row_key.value)

    def _open_row(self, key: str) -> None:
        if key.startswith("h"):
            self.table.toggle_host(key[1:])
        elif key.startswith("r"):
            self.push_screen(RankDetailScreen(int(key[1:])))

    def action_toggle_panel(self, name: str) -> None:
        panel = self._panel(name)
        panel.display = not panel.display

    def _panel(self, name: str) -> Widget:
        return self.screen_stack[0].query_one(PANELS[name])

    def _show_panel(self, name: str) -> None:
        self._panel(name).display = True

    def action_filter_logs(self) -> None:
        self.push_screen(LogFilterScreen(self.logs.log_filter), self._set_filter)

    def action_cycle_level(self) -> None:
        self._set_filter(self.logs.log_filter.next_level())

    def action_filter_selected_rank(self) -> None:
        """Logs of the selected rank only; again (or on a host row) shows every rank."""
        logs = self.logs
        key = self.table.selected_key()
        current = logs.log_filter
        if key is None or not key.startswith("r"):
            ranks = None
        else:
            rank = int(key[1:])
            ranks = None if current.ranks == frozenset({rank}) else frozenset({rank})
        self._set_filter(LogFilter(ranks, current.level))

    def _set_filter(self, log_filter: LogFilter | None) -> None:
        if log_filter is None:
            return
        self._show_panel("logs")
        self.logs.set_filter(log_filter)
        self.logs.border_title = f"logs · {log_filter.describe()}"
