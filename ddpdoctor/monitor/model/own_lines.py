"""A rank's error and exit lines, and whether its own process bore them out.

Any process of the job can append to a rank's event file. The runtime of a rank writes its exit
event last and closes the file at once, and its heartbeats count the fatal errors it wrote
(`errors`). So an exit line after which the same process writes on, and a fatal error line that
two of its heartbeats do not count, are someone else's (or left from before): they end nothing
and are reported (RankTracker.contradicted; the `run.forged_exit` warning). Until a heartbeat
counts it, a fatal error line without an exit is unconfirmed: the rank is not failed for it
while its process may still run (ddpdoctor.monitor.model.rank_views) — where its heartbeats
are known to count them (an older runtime's do not: its error lines are taken as they are).

The heartbeats themselves are numbered by the runtime (`seq`, one after another; one may be
dropped, none repeated). A number read again or going back means a second stream writes the
file: the rank's heartbeats are disputed (`own_beat`) and from then on say that it lives and
where it is, but decide nothing.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.monitor.model.event_fields import integer, location, text
from ddpdoctor.protocol.torchrun_logs import signal_name

# Heartbeats that count fewer fatal errors than the lines say, to contradict the latest: the
# first after a real error may have been made just before it and written just after.
BEATS_AGAINST = 2


def error_event(tracker: Any, e: dict[str, Any], t: float | None, where: Any) -> None:
    fatal = e.get("fatal")
    thread = text(e.get("thread"))
    if fatal is False or (fatal is None and thread not in (None, "MainThread")):
        tracker.last_event = "error (non-fatal)"
        return  # a thread's exception that did not end the rank
    exc_type = text(e.get("exc_type")) or "Error"
    message = (text(e.get("message")) or "").strip()
    first = message.splitlines()[0] if message else ""
    tracker.error = f"{exc_type}: {first}"[:300] if first else exc_type
    tracker.traceback = text(e.get("traceback"))
    tracker.error_t = t
    tracker.error_at = where
    tracker.error_line = location(e.get("location"))
    tracker.last_event = f"error {exc_type}"
    tracker.fatal_errors += 1
    # (a process whose heartbeats never counted errors, an older runtime's, cannot bear it out)
    tracker.error_unconfirmed = tracker.counts_errors
    tracker.beats_against_error = 0


def own_beat(tracker: Any, e: dict[str, Any]) -> bool:
    """Whether a heartbeat may decide something as its process's own: false once the rank's
    heartbeats are disputed (a number read again or going back). A disputed stream confirms no
    error line (it stands once the process is seen gone), bears out no call, and makes the rank
    blocked only where the watcher sees its CPU idle itself (ddpdoctor.monitor.model.progress).
    The heartbeat that shows the dispute, or one before it, may be the forged one: an error it
    confirmed goes back to unconfirmed."""
    seq = integer(e.get("seq"))
    last = tracker.beat_seq
    if seq is not None and last is not None and seq <= last:
        tracker.disputed_beats += 1
        if tracker.beats_disputed is None:
            tracker.beats_disputed = f"heartbeat #{seq} read after #{last}"
        if not tracker.progress.disputed:
            tracker.progress.disputed = True
            if tracker.error is not None and tracker.exit_code is None and tracker.counts_errors:
                tracker.error_unconfirmed = True  # whichever beat counted it may be forged
                tracker.beats_against_error = 0
    elif seq is not None:
        tracker.beat_seq = seq
    return not tracker.progress.disputed


def weigh_error(tracker: Any, counted: int | None) -> None:
    """A heartbeat after an unconfirmed fatal error line: its runtime's count of the fatal
    errors it wrote (None: a runtime that does not count) confirms the line, or, at
    BEATS_AGAINST heartbeats, contradicts it."""
    if counted is None or counted >= tracker.fatal_errors:
        tracker.error_unconfirmed = False
        return
    tracker.beats_against_error += 1
    if tracker.beats_against_error >= BEATS_AGAINST:
        tracker.fatal_errors = counted
        contradict(tracker, "its own heartbeats count no such error")


def exit_event(tracker: Any, e: dict[str, Any], t: float | None, where: Any) -> None:
    code = integer(e.get("code"))
    if code == 0 and tracker.error_unconfirmed and tracker.exit_code is None:
        # a runtime that wrote a fatal error exits 1 after it: a clean end of the process
        # contradicts an error line nothing of it bore out
        contradict(tracker, "then its process ended cleanly")
    tracker.exit_code = code if code is not None else (1 if tracker.error else 0)
    tracker.exit_reason = text(e.get("reason"))
    tracker.exit_t = t
    sig = text(e.get("signal"))
    tracker.exit_signal = sig or signal_name(tracker.exit_code)
    if tracker.exit_reason == "signal" and tracker.exit_signal is None:
        tracker.exit_signal = "SIGTERM"
    if tracker.exit_reason != "signal":  # stopped from outside: keep what it was doing
        tracker.last_event = f"exit {tracker.exit_code}"


def contradict(tracker: Any, why: str) -> None:
    """The rank's exit line (and the error before it), or its latest fatal error line, is not
    its process's own: dropped, and reported (`contradicted`), never acted on."""
    if tracker.exit_code is not None:
        said = f"exit {tracker.exit_code}" + (f" after {tracker.error}" if tracker.error else "")
    else:
        said = tracker.error or "an error"
    tracker.contradicted = f"{said}; {why}"
    tracker.exit_doubted = False
    tracker.error_unconfirmed = False
    tracker.exit_code = tracker.exit_reason = tracker.exit_t = tracker.exit_signal = None
    tracker.error = tracker.traceback = tracker.error_line = None
    tracker.error_t = None
    tracker.error_at = None
