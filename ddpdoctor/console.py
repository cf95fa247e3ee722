"""Terminal output shared by the commands: one Console factory, status symbols, the error line.

Rich decides colour: none without a TTY or with NO_COLOR set. Symbols fall back to ASCII when the
stream cannot encode them, so logs and CI consoles never show mojibake.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
from typing import IO, TextIO

from rich.console import Console

UNICODE_SYMBOLS = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-", "error": "?"}
ASCII_SYMBOLS = {"pass": "+", "warn": "!", "fail": "x", "skip": "-", "error": "?"}
STATUS_STYLES = {
    "pass": "green",
    "warn": "yellow",
    "fail": "bold red",
    "skip": "dim",
    "error": "magenta",
}


def stream_is_unicode(stream: IO[str]) -> bool:
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        return codecs.lookup(encoding).name in ("utf-8", "utf-16", "utf-32")
    except LookupError:
        return False


class SafeStream:
    """A text stream whose writes never fail: ddpdoctor's own output must never end ddpdoctor (and
    with it the job it runs). A reader that went away (`| head`: a broken pipe) or a full disk
    (`> /dev/full`) ends the printing quietly; everything else goes on. Rich would otherwise turn a
    broken pipe into SystemExit(1) in the middle of a run.

    After the first failure the descriptor is pointed at /dev/null, so the interpreter's last flush
    at exit cannot fail either."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self._give_up()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._give_up()

    def _give_up(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def isatty(self) -> bool:
        return _isatty(self._stream)

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def safe_stream(stream: TextIO) -> TextIO:
    """`stream` wrapped so that writing to it never raises (see SafeStream); idempotent."""
    if isinstance(stream, SafeStream):
        return stream
    return SafeStream(stream)  # type: ignore[return-value]


def make_console(stream: TextIO | None = None, *, width: int | None = None) -> Console:
    """A Console for `stream`. Off a terminal (pipes, CI logs) lines are not wrapped at 80 columns:
    a wide virtual width keeps each result on one line, which reads and greps better in logs.
    Writes never raise (SafeStream): a closed pipe or a full disk ends the printing, nothing else."""
    stream = safe_stream(stream if stream is not None else sys.stdout)
    if width is None and not _isatty(stream):
        width = 200
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def tui_capable(stdout: TextIO | None = None, stdin: TextIO | None = None) -> bool:
    """A full-screen TUI needs a terminal on both ends that can draw: TERM=dumb (Emacs shells,
    some CI runners) or no TERM at all gets plain text."""
    stdout = stdout if stdout is not None else sys.stdout
    stdin = stdin if stdin is not None else sys.stdin
    if os.environ.get("TERM", "") in ("", "dumb"):
        return False
    return _isatty(stdout) and _isatty(stdin)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def symbols_for(stream: IO[str]) -> dict[str, str]:
    return UNICODE_SYMBOLS if stream_is_unicode(stream) else ASCII_SYMBOLS


def error_line(message: str) -> str:
    """The one line every error ends with (stderr)."""
    first = " ".join(str(message).split())
    return f"ddpdoctor: error: {first}"
