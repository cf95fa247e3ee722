"""Lines as the explainers see them: text, where it came from, and which rank wrote it.

A rank is read from the launcher prefixes torch and torchrun put in front of a line (`[rank3]:`,
torchrun's `[default1]:` local-rank tag, MPI's `[1,2]<stdout>:`), and otherwise from the file's place
in a run directory (`.../attempt_0/<local_rank>/stderr.log`, `nccl/<host>.<pid>.log`).
Files are streamed with a bounded line length, so a 1 GB log or binary junk never loads whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ddpdoctor.protocol import bounded

# A line longer than this is cut (the rest of it is skipped): no single line can exhaust memory.
MAX_LINE_BYTES = 64 * 1024
# Lines are matched on their first this many characters (the head, where the launcher prefix,
# the logger's level and the message start): every explainer's cost per line is then bounded
# whatever a job prints, on top of the patterns themselves being linear.
MAX_MATCH_CHARS = 4096
# Evidence text is shortened to this many characters.
MAX_EVIDENCE_CHARS = 2000

_PREFIX = re.compile(
    r"^(?:\[\d+\] )?"  # a pid some wrappers print first: "[80746] "
    r"(?:\[default(?P<local>\d+)\]:)?"  # torchrun --tee: local rank
    r"(?:\[rank(?P<rank>\d+)\]: ?"  # torch >= 2.2 on every rank's stderr
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>: ?"  # mpirun --tag-output
    r"|\(pid=\d+\) )?"  # ray workers
)
_PREFIX_STARTS = ("[", "(")
_ATTEMPT_PATH = re.compile(r"attempt_\d+[/\\](\d+)[/\\](?:stdout|stderr)\.log$")
_NCCL_FILE = re.compile(r"(?:^|[/\\])nccl[/\\](?P<host>.+)\.(?P<pid>\d+)\.log$")

# Maps a torchrun local rank to the global rank, where a run directory's hello events know it.
LocalRankMap = Callable[[int], int | None]  # None: which rank, nothing says


class SourceLine(NamedTuple):
    """One line. A NamedTuple, not a dataclass: one is made per line read, and it is 10x cheaper."""

    text: str  # the line as read, without its newline
    body: str  # the line without launcher prefixes ([rank0]:, [default0]:, ...)
    file: str | None
    line_no: int | None
    rank: int | None  # the rank that wrote it, when the prefix or the file says

    def evidence_text(self) -> str:
        text = self.text
        if len(text) > MAX_EVIDENCE_CHARS:
            text = text[:MAX_EVIDENCE_CHARS] + "…"
        return text


@dataclass(frozen=True)
class FileContext:
    """What the file's place says about its lines: the writer's rank and how to map local ranks."""

    label: str | None
    rank: int | None = None
    local_to_global: LocalRankMap | None = None
    named: bool = False  # named by the user on the command line (not found in a folder)

    def make_line(self, text: str, line_no: int | None) -> SourceLine:
        if len(text) > MAX_MATCH_CHARS:
            text = text[:MAX_MATCH_CHARS]
        if text[:1] not in _PREFIX_STARTS:  # the common case: no launcher prefix at all
            return SourceLine(text, text, self.label, line_no, self.rank)
        match = _PREFIX.match(text)
        body = text[match.end() :] if match else text
        rank = self.rank
        if match:
            if match.group("rank") is not None:
                rank = int(match.group("rank"))
            elif match.group("mpi") is not None:
                rank = int(match.group("mpi"))
            elif match.group("local") is not None:
                local = int(match.group("local"))
                rank = self.local_to_global(local) if self.local_to_global else local
        return SourceLine(text, body, self.label, line_no, rank)


def local_rank_from_path(path: str) -> int | None:
    """torchrun --log-dir writes `<run-id>/attempt_<n>/<local_rank>/{stdout,stderr}.log`."""
    match = _ATTEMPT_PATH.search(path)
    return int(match.group(1)) if match else None


def nccl_file_owner(path: str) -> tuple[str, int] | None:
    """NCCL_DEBUG_FILE=RUN_DIR/nccl/%h.%p.log: the host and pid that wrote it."""
    match = _NCCL_FILE.search(path)
    return (match.group("host"), int(match.group("pid"))) if match else None


def iter_text_lines(stream: BinaryIO, limit: int | None = None) -> Iterator[str]:
    """Decoded lines of a binary stream, each at most MAX_LINE_BYTES; bad bytes become U+FFFD.
    `limit`: read no more than this many bytes (a log still growing is read as it was)."""
    remaining = limit
    while True:
        if remaining is not None and remaining <= 0:
            return
        raw = stream.readline(
            MAX_LINE_BYTES if remaining is None else min(MAX_LINE_BYTES, remaining)
        )
        if not raw:
            return
        if remaining is not None:
            remaining -= len(raw)
        if not raw.endswith(b"\n") and len(raw) >= MAX_LINE_BYTES:
            _skip_rest_of_line(stream)
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if "\x00" in text:  # binary junk: keep the line countable but harmless
            text = text.replace("\x00", "")
        yield text


def _skip_rest_of_line(stream: BinaryIO) -> None:
    while True:
        chunk = stream.readline(MAX_LINE_BYTES)
        if not chunk or chunk.endswith(b"\n"):
            return


def iter_file_lines(
    path: Path, context: FileContext, *, follow: bool = False
) -> Iterator[SourceLine]:
    """The lines of a regular file, as far as it reached when it was opened: a file that grows
    while it is read (a live log, a writer in a loop) cannot keep the reader going forever.
    Never a FIFO or a device (protocol/bounded.py: NotRegularFile, an OSError); `follow`: a file
    the user named may be a symlink, one found in a folder may not."""
    with bounded.open_regular(path, buffered=True, follow=follow) as stream:
        size = os.fstat(stream.fileno()).st_size
        for number, text in enumerate(iter_text_lines(stream, size), start=1):
            yield context.make_line(text, number)
