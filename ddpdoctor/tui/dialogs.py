"""Modal dialogs: the quit confirmation (run mode) and the log filter prompt."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ddpdoctor.tui.log_filter import LogFilter, parse_log_filter

QUIT_EXPLANATION = (
    "The job is still running. It is a child of this `ddpdoctor run`, which ends the job's "
    "processes when it exits, so quitting stops the job. To watch a job without owning it, "
    "start it elsewhere and use `ddpdoctor watch RUN_DIR`."
)


class QuitRunScreen(ModalScreen[bool]):
    """Stop the job and quit, or keep watching. Dismisses with True to stop."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,s", "stop", "Stop job and quit"),
        Binding("escape,n", "cancel", "Keep watching"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-box") as box:
            box.border_title = "quit"
            yield Static(QUIT_EXPLANATION, id="quit-text")
            with Horizontal(id="quit-buttons"):
                yield Button("Stop the job and quit (y)", variant="error", id="quit-stop")
                yield Button("Keep watching (esc)", variant="primary", id="quit-cancel")

    def on_mount(self) -> None:
        self.query_one("#quit-cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "quit-stop")

    def action_stop(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class LogFilterScreen(ModalScreen[LogFilter | None]):
    """A one-line prompt: ranks and/or a level. Dismisses with the new filter, or None to cancel."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: LogFilter) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="filter-box") as box:
            box.border_title = "filter logs"
            yield Label("ranks (3, 0-7, 1,4) and/or a level (all, warn, error); empty shows all")
            yield Input(value=self.current.text(), id="filter-input")
            yield Label("", id="filter-error", markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            self.dismiss(parse_log_filter(event.value))
        except ValueError as exc:
            self.query_one("#filter-error", Label).update(str(exc))

    def action_cancel(self) -> None:
        self.dismiss(None)
