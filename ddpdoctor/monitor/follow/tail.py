"""Incremental readers of growing files: one FileTail per file, one RunTailer per run directory.

Each file is read by byte offset from where the last read stopped, so a poll costs a stat per file
plus whatever is new. The last line of a file may be torn (a writer between write() and flush):
its bytes wait in a buffer until their newline arrives. A file that shrinks (truncation) or whose
inode changes (rotation: a new file under the same name) is read again from the start.
Files are opened only while they are read, so a run of 1024 ranks does not hold 1024 descriptors.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.protocol import bounded
from ddpdoctor.protocol.rundir import RunDir, make_private
from ddpdoctor.protocol.torchrun_logs import LogSource, classify_log_path

# A poll reads at most this much of one file; the rest waits for the next poll, so one huge
# NCCL log cannot make a poll slow.
MAX_READ_BYTES = 4 << 20
# A "line" with no newline this long is cut and emitted, so a runaway writer cannot grow memory.
MAX_PARTIAL_BYTES = 1 << 20


@dataclass
class FileTail:
    """Follows one file. `read()` returns the complete new lines as (line number, bytes)."""

    path: Path | str
    offset: int = 0
    inode: int | None = None
    line_no: int = 0  # lines emitted so far (1-based numbers for the next ones follow it)
    partial: bytes = b""
    resets: int = 0  # truncations / rotations seen
    error: str | None = None  # why the last read failed (permission denied, ...), else None

    def _reset(self) -> None:
        self.offset = 0
        self.line_no = 0
        self.partial = b""
        self.resets += 1

    def read(self, max_bytes: int = MAX_READ_BYTES) -> list[tuple[int, bytes]]:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return []  # not there (yet, or any more): nothing new
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            return []
        if not stat.S_ISREG(st.st_mode):
            # a FIFO, a device or a link among the files of a run: never read (a FIFO blocks
            # its reader, /dev/zero never ends); what it claims is no record of the job
            self.error = "not a regular file: not read"
            return []
        if (self.inode is not None and st.st_ino != self.inode) or st.st_size < self.offset:
            self._reset()
        self.inode = st.st_ino
        if st.st_size == self.offset:
            return []
        # Ask for exactly what is new: read(n) allocates n bytes up front, so a large fixed n
        # would cost a big allocation per file per poll.
        want = min(max_bytes, st.st_size - self.offset)
        try:
            data = bounded.read_bytes(self.path, want, whole=False, offset=self.offset)
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            return []
        self.error = None
        self.offset += len(data)
        return self._split(data)

    def _split(self, data: bytes) -> list[tuple[int, bytes]]:
        chunk = self.partial + data if self.partial else data
        parts = chunk.split(b"\n")
        self.partial = parts.pop()  # b"" when the chunk ended with a newline
        if len(self.partial) > MAX_PARTIAL_BYTES:
            parts.append(self.partial)
            self.partial = b""
        out: list[tuple[int, bytes]] = []
        for raw in parts:
            self.line_no += 1
            out.append((self.line_no, raw[:-1] if raw.endswith(b"\r") else raw))
        return out


@dataclass(frozen=True)
class EventLines:
    """New lines of one rank's event file (`rel`: its path relative to the run directory)."""

    rel: str
    lines: list[tuple[int, bytes]]


@dataclass(frozen=True)
class LogLines:
    """New lines of one log file, with what the path says about it."""

    source: LogSource
    lines: list[tuple[int, str]]


@dataclass
class TailBatch:
    events: list[EventLines] = field(default_factory=list)
    logs: list[LogLines] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.events and not self.logs


class RunTailer:
    """Tails every file of a run directory: events, torchrun's per-rank logs, the launcher's
    torchrun.log and NCCL logs. Files that appear later are picked up at the next discovery."""

    def __init__(self, run: RunDir, *, discover_every_s: float = 1.0, read_logs: bool = True):
        self.run = run
        self.read_logs = read_logs
        self.discover_every_s = discover_every_s
        self._events: dict[str, tuple[FileTail, str]] = {}  # path -> (tail, relative path)
        self._logs: dict[str, tuple[FileTail, LogSource]] = {}
        self._last_discovery: float | None = None
        # Ranks whose files are not read for now: their node's summary stands for them.
        self.paused: set[str] = set()
        # Where logs are looked for (None: all of logs/ and nccl/): a launcher of a job over
        # several nodes reads its own node's logs only.
        self.log_roots: tuple[Path, ...] | None = None
        self.events_dir_error: str | None = None  # why events/ cannot be listed, if it cannot

    @property
    def unreadable(self) -> dict[str, str]:
        """Files (relative path -> why) and events/ itself that could not be read last time."""
        found = {rel: tail.error for tail, rel in self._events.values() if tail.error}
        if self.events_dir_error:
            found["events/"] = self.events_dir_error
        return found

    def pause(self, rank: int) -> None:
        """Stop reading rank R's event file (found now or later) until `resume(R)`."""
        self.paused.add(str(self.run.events_file(rank)))

    def resume(self, rank: int) -> None:
        """Read rank R's event file again, from its start."""
        key = str(self.run.events_file(rank))
        self.paused.discard(key)
        if key in self._events:
            self._events[key] = (FileTail(key), self._events[key][1])

    def event_ranks(self) -> list[int]:
        """The ranks whose event files have been found."""
        found = []
        for _tail, rel in self._events.values():
            digits = rel[len("events/rank-") : -len(".jsonl")]
            if digits.isdigit():
                found.append(int(digits))
        return found

    def discover(self, now: float) -> None:
        self._last_discovery = now
        try:
            os.listdir(self.run.events_dir)
            self.events_dir_error = None
        except FileNotFoundError:
            self.events_dir_error = None
        except OSError as exc:
            self.events_dir_error = exc.strerror or str(exc)
        for key, name in _list_files(self.run.events_dir, suffix=".jsonl"):
            if key not in self._events and name.startswith("rank-"):
                self._events[key] = (FileTail(key), f"events/{name}")
        if not self.read_logs:
            return
        roots = self.log_roots if self.log_roots is not None else (self.run.logs_dir,)
        for base in (*roots, self.run.nccl_dir):
            for path in _walk_files(base):
                key = str(path)
                if key in self._logs:
                    continue
                rel = path.relative_to(self.run.path)
                source = classify_log_path(rel.parts)
                if source is not None:
                    self._logs[key] = (FileTail(path), source)
                    _make_private_up_to(path, base)

    def poll(self, now: float, *, drain: bool = False) -> TailBatch:
        """Everything new since the last poll (discovering new files at most every second).
        `drain`: read every file to its end, however much that is (a finished run's first look:
        a verdict from part of a file would be wrong), instead of MAX_READ_BYTES a file."""
        if (
            drain
            or self._last_discovery is None
            or now - self._last_discovery >= self.discover_every_s
        ):
            self.discover(now)
        batch = TailBatch()
        for key, (tail, rel) in self._events.items():
            if key in self.paused:
                continue
            lines = _read(tail, drain)
            if lines:
                batch.events.append(EventLines(rel, lines))
        for tail, source in self._logs.values():
            raw = _read(tail, drain)
            if raw:
                text = [(n, b.decode("utf-8", errors="replace")) for n, b in raw]
                batch.logs.append(LogLines(source, text))
        return batch

    @property
    def event_files(self) -> int:
        return len(self._events)


def _make_private_up_to(path: Path, base: Path) -> None:
    """torchrun makes its per-rank log folders and files with the umask's modes (0755, 0644): a
    log, once found, is made private like the rest of the run directory, with its folders."""
    make_private(path)
    for folder in path.parents:
        if folder == base or base not in folder.parents:
            break
        make_private(folder)


def _read(tail: FileTail, drain: bool) -> list[tuple[int, bytes]]:
    lines = tail.read()
    while drain:
        more = tail.read()
        if not more:
            break
        lines.extend(more)
    return lines


def _list_files(folder: Path, *, suffix: str) -> Iterator[tuple[str, str]]:
    """(path, name) of the files in `folder` ending in `suffix` (strings: cheap for 1000s)."""
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.endswith(suffix) and entry.is_file():
                    yield entry.path, entry.name
    except OSError:
        return


def _walk_files(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if name.endswith(".log"):
                yield Path(root) / name
