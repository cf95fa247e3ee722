"""The one thread that does the app's file I/O: poll the source when woken, post one message.

Modelled on memray's live TUI: a Textual timer only sets an Event; this thread waits on it, calls
`source.poll()` (and `job.returncode()`), and posts a SnapshotReady (or PollFailed) to the app. Wake
ups that arrive while a poll is running collapse into one, and the next poll waits until the app
has taken the last message (`ack`): one snapshot in flight at a time, so a busy screen is never
handed snapshots it would only drop, and no CPU goes into building them. It is a plain daemon thread, not an executor worker, so a source stuck
in I/O can never keep the app from exiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from textual.message import Message

from ddpdoctor.console import sanitize, sanitize_tree
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.tui.messages import PollFailed, SnapshotReady
from ddpdoctor.tui.protocols import JobHandle, SnapshotSource


def describe_error(exc: BaseException) -> str:
    text = sanitize(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


ACK_TIMEOUT_S = 2.0


class SnapshotPoller:
    def __init__(
        self,
        source: SnapshotSource,
        post: Callable[[Message], object],
        *,
        job: JobHandle | None = None,
        prepare: Callable[[Snapshot], object] | None = None,
    ) -> None:
        self._source = source
        self._post = post
        self._job = job
        self._prepare = prepare
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._taken = threading.Event()  # the app took the last message
        self._taken.set()
        self._serial = 0
        self.last_poll_s: float | None = None  # duration of the latest poll, for benchmarks
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-tui-poll", daemon=True)

    def start(self) -> None:
        self._wake.set()  # the first snapshot as soon as possible
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def ack(self) -> None:
        """The app has applied (or dropped) the last message: the next poll may start."""
        self._taken.set()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._wake.set()
        self._taken.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Bounded wait: the stop flag is seen even if a wake-up is lost.
            if not self._wake.wait(timeout=0.5):
                continue
            self._wake.clear()
            # Bounded too: a message the app never acknowledges only slows polling down.
            self._taken.wait(timeout=ACK_TIMEOUT_S)
            if self._stop.is_set():
                return
            self._taken.clear()
            self._poll_once()

    def _poll_once(self) -> None:
        self._serial += 1
        started = time.perf_counter()
        try:
            # Every string the views show comes from here: job text reaches the terminal with
            # its control sequences escaped (ddpdoctor.console.sanitize).
            snapshot = sanitize_tree(self._source.poll())
            returncode = self._job.returncode() if self._job is not None else None
            stopped_for = _stopped_for(self._source)
        except Exception as exc:  # noqa: BLE001 - any source failure is shown, never fatal
            self._post(PollFailed(describe_error(exc), serial=self._serial))
            return
        finally:
            self.last_poll_s = time.perf_counter() - started
        prepared = None
        if self._prepare is not None:
            try:
                prepared = self._prepare(snapshot)
            except Exception:  # noqa: BLE001 - the app builds its views itself then
                prepared = None
        self._post(
            SnapshotReady(
                snapshot,
                serial=self._serial,
                job_returncode=returncode,
                prepared=prepared,
                stopped_for=stopped_for,
            )
        )


def _stopped_for(source: object) -> str | None:
    """The verdict for which the source's supervision stopped the job, when it did (optional)."""
    reason = getattr(source, "stopped_for", None)
    if reason is None:
        return None
    return str(getattr(reason, "value", reason))


def call_with_timeout(fn: Callable[[], object], timeout_s: float, what: str) -> object:
    """Run `fn` in a daemon thread and wait at most `timeout_s`: a blocked call is abandoned, not waited on.

    Used for request_stacks() and job.stop(), which run in Textual thread workers; bounding them
    here keeps those workers (and so the app's exit) from hanging on a stuck py-spy or process.
    """
    outcome: list[BaseException] = []
    result: list[object] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting worker below
            outcome.append(exc)

    thread = threading.Thread(target=target, name=f"ddpdoctor-tui-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout_s:g} s")
    if outcome:
        raise outcome[0]
    return result[0] if result else None
