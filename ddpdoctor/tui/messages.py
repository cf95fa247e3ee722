"""Messages from the poll thread to the app. Each kind replaces a stale one still in the queue.

Textual merges a message with the one queued right behind it when `can_replace` says so (Toolong's
scheme), so a slow frame never leaves a backlog of old snapshots to apply one by one: latest wins.
"""

from __future__ import annotations

from textual.message import Message

from ddpdoctor.monitor.model.snapshot import Snapshot


class SnapshotReady(Message):
    """A fresh snapshot, with the job's exit status when a job is attached (None while it runs)."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        serial: int,
        job_returncode: int | None,
        prepared: object | None = None,
        stopped_for: str | None = None,
    ) -> None:
        super().__init__()
        self.snapshot = snapshot
        # Set when the source (the launcher's supervision) stopped the job itself: "hang", ...
        self.stopped_for = stopped_for
        self.prepared = prepared  # view models built on the poll thread (view_model.PreparedView)
        # Increases with every poll: an older snapshot is never applied over a newer one.
        self.serial = serial
        self.job_returncode = job_returncode

    def can_replace(self, message: Message) -> bool:
        # Called with the message queued right behind this one: drop this one for it, if newer.
        return isinstance(message, SnapshotReady) and message.serial >= self.serial


class PollFailed(Message):
    """The source raised; the last good snapshot stays on screen and polling goes on."""

    def __init__(self, error: str, *, serial: int) -> None:
        super().__init__()
        self.error = error
        self.serial = serial

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PollFailed) and message.serial >= self.serial
