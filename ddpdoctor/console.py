"""Terminal output shared by the commands: one Console factory, status symbols, the error line.

Rich decides colour: none without a TTY or with NO_COLOR set. Symbols fall back to ASCII when the
stream cannot encode them, so logs and CI consoles never show mojibake.

Text from jobs, logs, exception messages and environment values ends up inside ddpdoctor's own
output (evidence lines, error messages, host names). A terminal obeys the control sequences such
text may carry (OSC 52 writes the clipboard, OSC 0 the title, CSI moves the cursor or clears the
screen), so every console made here shows them escaped instead (`sanitize`): a render hook passes
each printed renderable's text through it. Only the job's own output relayed line for line
(`Verbatim`) is written as the job wrote it.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from typing import IO, Any, TextIO, TypeVar

from rich.console import Console, ConsoleOptions, RenderableType, RenderHook
from rich.segment import Segment

T = TypeVar("T")

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
            except UnicodeEncodeError:
                self._write_degraded(text)
            except (OSError, ValueError):
                self._give_up()
        return len(text)

    def _write_degraded(self, text: str) -> None:
        """A character the stream cannot encode (PYTHONIOENCODING=ascii, a latin-1 locale) costs
        that character, never the line: it is written as `?`."""
        encoding = self.encoding
        try:
            degraded = text.encode(encoding, "replace").decode(encoding, "replace")
        except LookupError:
            degraded = text.encode("ascii", "replace").decode("ascii")
        try:
            self._stream.write(degraded)
        except (OSError, ValueError):
            self._give_up()

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


# C0 controls but newline and tab, DEL, and the C1 controls (U+0080-U+009F: 0x9B is a one-byte
# CSI, 0x9D a one-byte OSC to terminals that read them).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sanitize(text: str) -> str:
    """`text` with every control character a terminal would act on shown as an escape instead
    (`\\x1b]52;c;...` stays visible text): safe to print whatever it came from."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    """`text` sanitized and kept on one line: newlines and tabs shown as `\\n` and `\\t` too
    (a path or a name that holds them must not start a line ddpdoctor did not write)."""
    return sanitize(text).replace("\n", "\\n").replace("\t", "\\t")


def sanitize_tree(value: T) -> T:
    """`value` with every string inside it sanitized: dataclasses (frozen ones too), tuples, named
    tuples, lists, sets and dicts are rebuilt where something changed, and returned as they are
    otherwise (no copy of a clean snapshot). For views that render a whole structure (the TUI)."""
    return _sanitize_value(value)


def _sanitize_value(value: Any) -> Any:
    if isinstance(value, str):
        return sanitize(value) if _CONTROL.search(value) else value
    if isinstance(value, tuple):
        items = [_sanitize_value(item) for item in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list | set | frozenset):
        items = [_sanitize_value(item) for item in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    if isinstance(value, dict):
        pairs = [(_sanitize_value(k), _sanitize_value(v)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items(), strict=True)):
            return value
        return type(value)(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = _sanitize_value(old)
            if new is not old:
                changed[f.name] = new
        if not changed:
            return value
        out = copy.copy(value)
        for name, new in changed.items():
            object.__setattr__(out, name, new)  # frozen dataclasses too
        return out
    return value


class Verbatim:
    """A line of the job's own output, printed as the job wrote it (not ddpdoctor's text)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        yield Segment(self.text)
        yield Segment.line()


class Sanitized:
    """A renderable whose text is passed through `sanitize` once rich has laid it out; rich's own
    control segments (a live display moving the cursor) stay as they are."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.renderable, options):
            if segment.control or not _CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(sanitize(segment.text), segment.style)


class _SanitizeHook(RenderHook):
    def process_renderables(self, renderables: list) -> list:
        return [r if isinstance(r, Verbatim | Sanitized) else Sanitized(r) for r in renderables]


def make_console(stream: TextIO | None = None, *, width: int | None = None) -> Console:
    """A Console for `stream`. Off a terminal (pipes, CI logs) lines are not wrapped at 80 columns:
    a wide virtual width keeps each result on one line, which reads and greps better in logs.
    Writes never raise (SafeStream): a closed pipe or a full disk ends the printing, nothing else.
    Everything printed is sanitized (control sequences shown escaped) but `Verbatim` lines."""
    stream = safe_stream(stream if stream is not None else sys.stdout)
    if width is None and not _isatty(stream):
        width = 200
    console = Console(file=stream, width=width, highlight=False, soft_wrap=False)
    console.push_render_hook(_SanitizeHook())
    return console


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
    """The one line every error ends with (stderr), control sequences shown escaped."""
    first = sanitize(" ".join(str(message).split()))
    return f"ddpdoctor: error: {first}"
