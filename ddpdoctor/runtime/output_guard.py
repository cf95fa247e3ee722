"""The job's print() never fails because of ddpdoctor's log files.

Under `ddpdoctor run`, torchrun points each rank's stdout and stderr at a file in the run directory
(--redirects; a user's own command writes to torchrun.log there), and ddpdoctor shows those files
on the console. On a full file system (or over a
quota) a write to them fails, and a print() that fails ends a healthy job: ddpdoctor's way of
capturing output would then be what killed it. So when a rank's sys.stdout / sys.stderr is such a
file, it is wrapped: a write the file refuses for lack of space goes to the console instead (the
terminal, pipe or file of ddpdoctor's launcher, found up the parent chain, shown as the launcher
shows that file's lines: `[defaultN]:`-prefixed for a rank log), or is dropped when there is none; the file gets the text again once it has
room. The job's own files, and streams not in the run directory, are left alone.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
import time
from pathlib import Path

# Errors that mean "no room for this file": the log copy is given up for a while, never the job.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
RETRY_S = 5.0  # after a refused write, the file is tried again this often
_MAX_PARENTS = 8  # how far up the parent chain the launcher's console is looked for


class GuardedStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a rank whose output file may fill up."""

    def __init__(self, original, fd: int, prefix: str, console_fd: int) -> None:
        self._original = original
        self._fd = fd
        self._prefix = prefix.encode()
        self._console = console_fd  # the launcher's console (-1: none found)
        self._refused_at: float | None = None
        self.diverted_writes = 0  # writes that went to the console (or nowhere) instead
        self._pending = b""  # a console line not ended yet: whole lines only, never interleaved

    # -- the stream interface ------------------------------------------------------------------

    def write(self, text: str) -> int:
        data = text.encode(self.encoding, errors="backslashreplace")
        now = time.monotonic()
        if self._refused_at is None or now - self._refused_at >= RETRY_S:
            try:
                _write_all(self._fd, data)
                self._refused_at = None
                return len(text)
            except OSError as exc:
                if exc.errno not in _NO_ROOM:
                    raise
                self._refused_at = now
        self.diverted_writes += 1
        self._to_console(data)
        return len(text)

    def flush(self) -> None:
        """Every write to the file goes out at once; a console line not ended yet goes now."""
        if self._pending:
            pending, self._pending = self._pending, b""
            with contextlib.suppress(OSError):
                _write_all(self._console, self._prefix + pending)

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"

    @property
    def buffer(self):  # code that writes bytes reaches the file as before
        return self._original.buffer

    def __getattr__(self, name: str):
        return getattr(self._original, name)

    # -- internals ---------------------------------------------------------------------------

    def _to_console(self, data: bytes) -> None:
        if self._console < 0:
            return
        data = self._pending + data
        complete, _, self._pending = data.rpartition(b"\n")
        if len(self._pending) > 1 << 16:  # a line that never ends is written as it comes
            complete, self._pending = data, b""
        elif not complete and not data.startswith(b"\n"):
            return
        out = b"".join(self._prefix + line + b"\n" for line in complete.split(b"\n"))
        with contextlib.suppress(OSError):
            _write_all(self._console, out)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _run_dir_file(fd: int, run_dir: Path) -> Path | None:
    """The file `fd` writes to when it is a regular file below the run directory: a rank log of
    torchrun's --redirects, or torchrun.log, where a command's own output goes."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None
    return target if run_dir.resolve() in target.parents else None


def _prefix(target: Path, local_rank: int | None) -> str:
    """Lines of a rank log are shown `[defaultN]:`-prefixed; torchrun.log's as they are."""
    rank_log = target.parent.name.isdigit() and target.parent.parent.name.startswith("attempt_")
    if not rank_log:
        return ""
    return f"[default{local_rank if local_rank is not None else target.parent.name}]:"


def _console_of_launcher(run_dir: Path) -> int:
    """A descriptor on the stdout of the nearest ancestor whose stdout is not a file of the run
    directory (the launcher's console: the agents between write to torchrun.log), opened through
    /proc/PID/fd/1 and kept as this process's own; -1 when there is none."""
    pid = os.getppid()
    for _ in range(_MAX_PARENTS):
        if pid <= 1:
            return -1
        try:
            target = os.readlink(f"/proc/{pid}/fd/1")
            if not target.startswith(str(run_dir)) and target != os.devnull:
                return os.open(f"/proc/{pid}/fd/1", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return -1
    return -1


def install(run_dir: Path, local_rank: int | None) -> bool:
    """Wrap sys.stdout and sys.stderr where they are files of the run directory; True if so."""
    streams = [(name, getattr(sys, name, None)) for name in ("stdout", "stderr")]
    targets = []
    for name, stream in streams:
        try:
            fd = stream.fileno() if stream is not None else -1
        except (AttributeError, OSError, ValueError):
            continue
        if stream is None or fd < 0 or isinstance(stream, GuardedStream):
            continue
        target = _run_dir_file(fd, run_dir)
        if target is not None:
            targets.append((name, stream, fd, _prefix(target, local_rank)))
    if not targets:
        return False
    console_fd = _console_of_launcher(run_dir.resolve())
    for name, stream, fd, prefix in targets:
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
        setattr(sys, name, GuardedStream(stream, fd, prefix, console_fd))
    return True
