"""Terminal output shared by the commands: one Console factory, status symbols, the error line.

Rich decides colour: none without a TTY or with NO_COLOR set. Symbols fall back to ASCII when the
stream cannot encode them, so logs and CI consoles never show mojibake.
"""

from __future__ import annotations

import codecs
import sys
from typing import TextIO

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


def stream_is_unicode(stream: TextIO) -> bool:
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        return codecs.lookup(encoding).name in ("utf-8", "utf-16", "utf-32")
    except LookupError:
        return False


def make_console(stream: TextIO | None = None, *, width: int | None = None) -> Console:
    """A Console for `stream`. Off a terminal (pipes, CI logs) lines are not wrapped at 80 columns:
    a wide virtual width keeps each result on one line, which reads and greps better in logs."""
    stream = stream if stream is not None else sys.stdout
    if width is None and not _isatty(stream):
        width = 200
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def symbols_for(stream: TextIO) -> dict[str, str]:
    return UNICODE_SYMBOLS if stream_is_unicode(stream) else ASCII_SYMBOLS


def error_line(message: str) -> str:
    """The one line every error ends with (stderr)."""
    first = " ".join(str(message).split())
    return f"ddpdoctor: error: {first}"
