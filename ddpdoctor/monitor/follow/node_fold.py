"""One node's ranks, folded where they run, for a watcher on another host that cannot read their
files: what a Ray cluster's node actor does (ddpdoctor/launch/ray_relay.py).

A Ray cluster's hosts usually share no file system, so a rank on another node writes its event
file into that node's own copy of the run directory. `NodeFold` runs on that node: it reads the
event files there (regular files only, each read bounded), keeps the ranks whose hello names this
host, digests their events as a node's launcher does for torchrun (node_publisher.Publisher),
and makes the node's summary text, which the relay writes into the watcher's run directory as
nodes/node-<N>/summary.json: the existing merge reads it as any node's summary. It also sees its
ranks' processes (they are on its host): one that ends without an exit event is named in the
summary's `gone`, and at the end it gives each rank's file whole, so that the watcher's run
directory holds every event for the final diagnosis and for `ddpdoctor watch` afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.monitor.follow.liveness import pid_alive
from ddpdoctor.monitor.follow.node_publisher import Publisher
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.rundir import RunDir

READ_PER_POLL = 4 << 20  # bytes read from one rank's file per poll, at most
MAX_LINE = 1 << 20  # a longer line is not an event: skipped
MAX_RANK_FILES = 4096
MAX_FILE_BYTES = 256 << 20  # a rank's file given whole at the end, at most
_RANK_FILE = re.compile(r"^rank-(\d{1,7})\.jsonl$")


@dataclass
class _File:
    offset: int = 0
    line_no: int = 0
    partial: bytes = b""
    mine: bool | None = None  # its hello names this host (None: no hello read yet)
    pid: int | None = None
    hello_t: float | None = None
    ended: bool = False  # its exit event was read
    gone: bool = False  # its process ended without one
    skipped: list[int] = field(default_factory=list)


class NodeFold:
    """The ranks of this host in `run_dir`, read from their files; its summary on demand."""

    def __init__(self, run_dir: str, node_rank: int, host: str | None = None) -> None:
        self.run = RunDir(Path(run_dir))
        self.node_rank = node_rank
        self.host = host or socket.gethostname()
        self.files: dict[int, _File] = {}
        self.publisher = Publisher(self.run, node_rank)
        self.publisher.host = self.host

    def poll(self) -> None:
        """Read what is new in this host's ranks' files; note which of their processes ended."""
        for rank in self._rank_files():
            state = self.files.setdefault(rank, _File())
            if state.mine is False:
                continue
            self._read(rank, state)
        for state in self.files.values():
            settled = not state.mine or not state.pid or state.ended or state.gone
            if not settled and not pid_alive(state.pid or 0, state.hello_t):
                self._read_rest(state)
                state.gone = not state.ended

    def summary(self, now: float | None = None) -> str:
        """The node's summary text (its two lines), for nodes/node-<N>/summary.json."""
        self.poll()
        mine = [rank for rank, state in self.files.items() if state.mine]
        gone = sorted(rank for rank in mine if self.files[rank].gone)
        return self.publisher.compose(
            time.time() if now is None else now, mine, extra_head={"gone": gone}
        )

    def ranks(self) -> dict[int, dict[str, Any]]:
        """This host's ranks: rank -> {"pid", "gone", "ended", "bytes"}."""
        return {
            rank: {"pid": s.pid, "gone": s.gone, "ended": s.ended, "bytes": s.offset}
            for rank, s in self.files.items()
            if s.mine
        }

    def file_bytes(self, rank: int, start: int = 0) -> bytes:
        """Rank's event file from byte `start`, whole lines only (up to MAX_FILE_BYTES)."""
        state = self.files.get(rank)
        if state is None or not state.mine:
            return b""
        data = _read_regular(self.run.events_dir / f"rank-{rank}.jsonl", start, MAX_FILE_BYTES)
        cut = data.rfind(b"\n")
        return data[: cut + 1] if cut >= 0 else b""

    # -- reading -----------------------------------------------------------------------------

    def _rank_files(self) -> list[int]:
        try:
            with os.scandir(self.run.events_dir) as it:
                names = [e.name for e in it]
        except OSError:
            return []
        ranks = []
        for name in names[: MAX_RANK_FILES * 2]:
            match = _RANK_FILE.match(name)
            if match:
                ranks.append(int(match.group(1)))
        return sorted(ranks)[:MAX_RANK_FILES]

    def _read(self, rank: int, state: _File) -> None:
        path = self.run.events_dir / f"rank-{rank}.jsonl"
        data = _read_regular(path, state.offset, READ_PER_POLL)
        if not data:
            return
        state.offset += len(data)
        chunk = state.partial + data
        lines = chunk.split(b"\n")
        state.partial = lines.pop()
        if len(state.partial) > MAX_LINE:
            state.partial = b""  # (the rest of an overlong line is skipped with it)
        for raw in lines:
            state.line_no += 1
            if len(raw) > MAX_LINE:
                continue
            event = parse_event_line(raw.decode("utf-8", "replace"))
            if event is None or event.get("rank") != rank:
                continue
            kind = event.get("kind")
            if kind == ev.HELLO:
                state.mine = event.get("host") == self.host
                pid = event.get("pid")
                state.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
                t = event.get("t")
                state.hello_t = float(t) if isinstance(t, (int, float)) else None
                state.gone = state.ended = False
                if not state.mine:
                    self.publisher.forget(rank)
                    return
            elif kind == ev.EXIT:
                state.ended = True
            if state.mine:
                self.publisher.note(rank, state.line_no, event)

    def _read_rest(self, state: _File) -> None:
        """A rank whose process ended: its last lines first (an exit event may be among them)."""
        for rank, other in self.files.items():
            if other is state:
                self._read(rank, state)
                return


def _read_regular(path: os.PathLike[str] | str, start: int, limit: int) -> bytes:
    """Up to `limit` bytes of a regular file from `start`; b"" for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= start:
            return b""
        return os.pread(fd, min(limit, info.st_size - start), start)
    except OSError:
        return b""
    finally:
        os.close(fd)
