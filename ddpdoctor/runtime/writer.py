"""The per-rank event writer: one JSON object a line, appended and flushed line by line.

It runs inside training code, so it must never raise into it. Lines go out in whole `os.write`
calls on an O_APPEND descriptor under a lock: threads never interleave within a line and a reader
tailing the file sees whole lines (at worst a torn last line while a write is under way).

Two ways in:
- write(): now, on the caller's thread (hello, warning, fault, error, exit, heartbeat: the events
  that must be on disk before what comes next, a fault's os._exit for one).
- enqueue(): the hot path (collectives, steps, metrics): a deque append (and a wake-up of the
  heartbeat thread when the queue was empty). The heartbeat thread drains the queue within
  ~20 ms (flush()), so encoding and the system call happen off the training thread, mostly while
  it computes without the GIL. Every write() drains the queue first, so the file keeps the order
  in which events happened. A process killed outright (SIGKILL, os._exit, a segfault) loses at
  most the last ~20 ms of queued events; every other end writes an exit or error event, which
  drains the queue.

When writing fails (a full disk, a removed run directory, a read-only filesystem) the writer prints
ONE warning on stderr and stops writing; training goes on. It tries again now and then, because a
disk that was full may have room later, but it never warns twice.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# After a failed write, wait this long before trying the file again (quietly).
RETRY_AFTER_S = 30.0
# Queued events beyond this (a writer that cannot keep up, or no heartbeat thread) are dropped.
MAX_QUEUED = 100_000

# JSON leaves these unescaped, but str.splitlines() breaks lines at them: escape them so that a
# reader splitting text (not bytes) still sees one event per line.
_LINE_BREAKERS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


# The settings of ddpdoctor.events.encode_event, built once: this runs for every event.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False)


def encode_line(event: dict[str, Any]) -> bytes:
    """One event as one line of JSON (what encode_event writes, plus the newline)."""
    text = _ENCODER.encode(event)
    if not text.isascii():
        text = text.translate(_LINE_BREAKERS)
    return (text + "\n").encode("utf-8", errors="replace")


class EventWriter:
    """Appends events to one file. Thread-safe; every method swallows its own errors."""

    def __init__(self, path: str | os.PathLike[str], *, clock=time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        # Re-entrant: a signal handler may write the exit event while the interrupted thread
        # holds the lock in the middle of a write.
        self._lock = threading.RLock()
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._fd: int | None = None
        self._closed = False
        self._warned = False
        self._retry_at = 0.0
        self.lines_written = 0
        self.lines_dropped = 0
        # Called when an event lands in an empty queue (the heartbeat thread wakes to flush).
        self.on_first_queued: Callable[[], None] | None = None

    @property
    def healthy(self) -> bool:
        """False while writes are failing (after the one warning)."""
        return self._retry_at == 0.0 and not self._closed

    @property
    def pending(self) -> int:
        """Events queued and not written yet."""
        return len(self._queue)

    def enqueue(self, event: dict[str, Any]) -> None:
        """Queue an event for the next flush (the hot path: no encoding, no system call)."""
        if self._closed or len(self._queue) >= MAX_QUEUED:
            self.lines_dropped += 1
            return
        was_empty = not self._queue
        self._queue.append(event)
        if was_empty and self.on_first_queued is not None:
            self.on_first_queued()

    def write(self, event: dict[str, Any]) -> bool:
        """Write the queued events and then this one, now; True when this one reached the file."""
        with self._lock:
            return self._write_locked(event)

    def flush(self) -> bool:
        """Write what is queued; True when everything reached the file (or nothing waited)."""
        if not self._queue:
            return True
        with self._lock:
            return self._write_locked(None)

    def _write_locked(self, event: dict[str, Any] | None) -> bool:
        chunks: list[bytes] = []
        while self._queue:
            chunks.append(self._encode(self._queue.popleft()))
        if event is not None:
            chunks.append(self._encode(event))
        data = b"".join(chunks)
        lines = len(chunks)
        if not data:
            return event is None
        if self._closed or (self._retry_at and self._clock() < self._retry_at):
            self.lines_dropped += lines
            return False
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            view = memoryview(data)
            while view:  # a regular file takes it in one go; loop for odd filesystems
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            self._drop_fd()
            self._retry_at = self._clock() + RETRY_AFTER_S
            self.lines_dropped += lines
            self._fail(f"cannot write events to {self.path}: {exc.strerror or exc}")
            return False
        self._retry_at = 0.0
        self.lines_written += lines
        return True

    def _encode(self, event: dict[str, Any]) -> bytes:
        try:
            return encode_line(event)
        except Exception as exc:  # noqa: BLE001 - a value json cannot handle must not stop training
            self._fail(f"cannot encode a {event.get('kind')!r} event: {exc}")
            return b""

    def check_file(self) -> None:
        """Notice a run directory removed under us (writes to an unlinked file succeed silently).

        Called by the heartbeat thread: an event file with no name left is reported once; the next
        write reopens the path, which fails quietly (and is retried later) when its folder is gone."""
        with self._lock:
            if self._fd is None or self._closed:
                return
            try:
                unlinked = os.fstat(self._fd).st_nlink == 0
            except OSError:
                unlinked = True
            if not unlinked:
                return
            self._drop_fd()
        self._fail(f"the event file {self.path} was removed")

    def close(self) -> None:
        """Write what is queued, then refuse everything (the exit event was the last line)."""
        with self._lock:
            self._write_locked(None)
            self._closed = True
            self._drop_fd()

    def forget_after_fork(self) -> None:
        """In a forked child: stop writing without touching the parent's descriptor state."""
        self._lock = threading.RLock()
        self._closed = True
        self._queue.clear()  # the parent's events: the parent writes them
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _drop_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _fail(self, message: str) -> None:
        if self._warned:
            return
        self._warned = True
        try:
            sys.stderr.write(
                f"ddpdoctor: warning: {message}; training continues without event recording\n"
            )
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - stderr itself may be gone
            pass
