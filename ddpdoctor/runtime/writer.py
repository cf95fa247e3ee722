"""The per-rank event writer: one JSON object a line, appended and flushed line by line.

It runs inside training code, so it must never raise into it. Lines go out in whole `os.write`
calls on an O_APPEND descriptor under a lock: threads never interleave within a line and a reader
tailing the file sees whole lines (at worst a torn last line while a write is under way).

Two ways in:
- write(): now, on the caller's thread (hello, warning, fault, error, exit, heartbeat: the events
  that must be on disk before what comes next, a fault's os._exit for one).
- enqueue(): the hot path (gradient buckets, collective ends, steps, metrics): a deque append
  (and a wake-up of the heartbeat thread when the queue was empty). The heartbeat thread drains
  the queue ~20 ms after a quiet spell's first event, and every ~0.25 s while events keep coming
  (flush(); heartbeat.py), so encoding and the system call happen off the training thread,
  mostly while it computes without the GIL. Every write() drains the queue first, so the file
  keeps the order in which events happened. A process killed outright (SIGKILL, os._exit, a
  segfault, gloo's abort) loses at most the last ~0.25 s of queued events (a step of 5 ms or more
  is written as it closes: core.SLOW_STEP_S); every other end writes an exit or error event,
  which drains the queue. (The start of every collective but a gradient bucket is written at
  once, before the call: see records.CollectiveDesc.immediate.)

An event is a dict (encoded with json) or a hot-path record of ddpdoctor/runtime/records.py (a
tuple that encodes itself, with the writer's rank).

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

from ddpdoctor.protocol import jsontext
from ddpdoctor.runtime.records import Record

# Private (the run directory is, too), never through a symlink planted in the run directory,
# and not inherited by the processes the rank starts.
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

# After a failed write, wait this long before trying the file again (quietly).
RETRY_AFTER_S = 30.0
# Queued events beyond this (a writer that cannot keep up, or no heartbeat thread) are dropped.
MAX_QUEUED = 100_000

# JSON leaves these unescaped, but str.splitlines() breaks lines at them: escape them so that a
# reader splitting text (not bytes) still sees one event per line.
_LINE_BREAKERS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


# The settings of ddpdoctor.protocol.events.encode_event, built once: this runs for every event.
# allow_nan=False: a NaN or inf in an event is written as null (jsontext.finite), never as the
# invalid JSON token NaN.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False, allow_nan=False)


class EventWriter:
    """Appends events to one file. Thread-safe; every method swallows its own errors."""

    def __init__(
        self, path: str | os.PathLike[str], *, rank: int = 0, clock=time.monotonic
    ) -> None:
        self.path = Path(path)
        self.rank = rank  # what the records' lines say (dict events carry their own)
        self._clock = clock
        # Re-entrant: a signal handler may write the exit event while the interrupted thread
        # holds the lock in the middle of a write.
        self._lock = threading.RLock()
        self._queue: collections.deque[dict[str, Any] | Record] = collections.deque()
        self._fd: int | None = None
        self.closed = False  # refuses every event from now on (the exit event was the last)
        self._warned = False
        self._retry_at = 0.0
        self.lines_written = 0
        self.lines_dropped = 0
        self.enqueued = 0  # events that went through enqueue(), ever
        # Called when an event lands in an empty queue (the heartbeat thread wakes to flush).
        self.on_first_queued: Callable[[], None] | None = None

    @property
    def healthy(self) -> bool:
        """False while writes are failing (after the one warning)."""
        return self._retry_at == 0.0 and not self.closed

    @property
    def pending(self) -> int:
        """Events queued and not written yet."""
        return len(self._queue)

    def enqueue(self, event: dict[str, Any] | Record) -> None:
        """Queue an event for the next flush (the hot path: no encoding, no system call)."""
        queue = self._queue
        self.enqueued += 1
        if queue:
            if len(queue) < MAX_QUEUED and not self.closed:
                queue.append(event)
            else:
                self.lines_dropped += 1
            return
        if self.closed:
            self.lines_dropped += 1
            return
        queue.append(event)
        if self.on_first_queued is not None:
            self.on_first_queued()

    def write(self, event: dict[str, Any] | Record) -> bool:
        """Write the queued events and then this one, now; True when this one reached the file."""
        with self._lock:
            return self._write_locked(event)

    def write_record(self, record: Record) -> bool:
        """write() for one hot-path record (a slow step as it closes, on the training thread):
        with nothing queued and the file open, its line goes out in one `os.write` without the
        general path's batching (a fifth of the bytecode on a cold cache); else write()."""
        with self._lock:
            fd = self._fd
            if self._queue or fd is None or self._retry_at or self.closed:
                return self._write_locked(record)
            try:
                line = record[0](record, self.rank) + "\n"
            except Exception:  # noqa: BLE001 - the general path reports it, once
                return self._write_locked(record)
            if not line.isascii():  # a record's text is ASCII unless one of its values is not
                return self._write_locked(record)
            data = line.encode()
            try:
                written = os.write(fd, data)
                while written < len(data):  # a regular file takes it in one go
                    written += os.write(fd, data[written:])
            except OSError as exc:
                self._drop_fd()
                self._retry_at = self._clock() + RETRY_AFTER_S
                self.lines_dropped += 1
                self._fail(f"cannot write events to {self.path}: {exc.strerror or exc}")
                return False
            self.lines_written += 1
            return True

    def flush(self) -> bool:
        """Write what is queued; True when everything reached the file (or nothing waited)."""
        if not self._queue:
            return True
        with self._lock:
            return self._write_locked(None)

    def _write_locked(self, event: dict[str, Any] | Record | None) -> bool:
        queue, encode = self._queue, self._encode
        if queue:
            texts: list[str] = []
            append, rank = texts.append, self.rank
            while queue:
                queued = queue.popleft()
                if type(queued) is tuple:  # a hot-path record (most of them): encoded inline
                    try:
                        append(queued[0](queued, rank))
                        continue
                    except Exception:  # noqa: BLE001 - _encode reports it, once
                        pass
                text = encode(queued)
                if text is not None:
                    append(text)
            if event is not None:
                text = encode(event)
                if text is None:
                    event = None  # reported; what was queued still goes out
                else:
                    texts.append(text)
            lines = len(texts)
            if not lines:
                return event is None
            joined = "\n".join(texts) + "\n"
        elif event is not None:  # the usual direct write: one line, nothing queued
            text = encode(event)
            if text is None:
                return False
            lines, joined = 1, text + "\n"
        else:
            return True
        if not joined.isascii():
            joined = joined.translate(_LINE_BREAKERS)
        data = joined.encode("utf-8", errors="replace")
        if self.closed or (self._retry_at and self._clock() < self._retry_at):
            self.lines_dropped += lines
            return False
        try:
            fd = self._fd
            if fd is None:
                fd = self._fd = os.open(self.path, _OPEN_FLAGS, 0o600)
            written = os.write(fd, data)
            if written < len(data):  # a regular file takes it in one go; odd filesystems may not
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
        except OSError as exc:
            self._drop_fd()
            self._retry_at = self._clock() + RETRY_AFTER_S
            self.lines_dropped += lines
            self._fail(f"cannot write events to {self.path}: {exc.strerror or exc}")
            return False
        self._retry_at = 0.0
        self.lines_written += lines
        return True

    def _encode(self, event: dict[str, Any] | Record) -> str | None:
        """One event's line of JSON text (no newline), or None when it cannot be encoded."""
        try:
            if type(event) is tuple:
                return event[0](event, self.rank)
            try:
                return _ENCODER.encode(event)
            except ValueError:
                return _ENCODER.encode(jsontext.finite(event))
        except Exception as exc:  # noqa: BLE001 - a value json cannot handle must not stop training
            kind = (
                event.get("kind") if isinstance(event, dict) else getattr(event[0], "__name__", "")
            )
            self._fail(f"cannot encode a {kind!r} event: {exc}")
            return None

    def check_file(self) -> None:
        """Notice a run directory removed under us (writes to an unlinked file succeed silently).

        Called by the heartbeat thread: an event file with no name left is reported once; the next
        write reopens the path, which fails quietly (and is retried later) when its folder is gone."""
        with self._lock:
            if self._fd is None or self.closed:
                return
            try:
                unlinked = os.fstat(self._fd).st_nlink == 0
            except OSError:
                unlinked = True
            if not unlinked:
                return
            self._drop_fd()
        self._fail(f"the event file {self.path} was removed")

    def write_last(self, event: dict[str, Any] | Record) -> bool:
        """Write the queued events and then this one, and refuse everything after it: the exit
        event is a rank's last line even while its heartbeat thread still runs."""
        with self._lock:
            written = self._write_locked(event)
            self.closed = True
            self._drop_fd()
            return written

    def close(self) -> None:
        """Write what is queued, then refuse everything (the exit event was the last line)."""
        with self._lock:
            self._write_locked(None)
            self.closed = True
            self._drop_fd()

    def forget_after_fork(self) -> None:
        """In a forked child: stop writing without touching the parent's descriptor state."""
        self._lock = threading.RLock()
        self.closed = True
        self._queue.clear()  # the parent's events: the parent writes them
        self._drop_fd()

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
