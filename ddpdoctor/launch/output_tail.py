"""The job's output, read back from its files for display: torchrun writes its own lines straight
to torchrun.log and each rank's to its --log-dir files, so nothing the job prints passes through
ddpdoctor (a ddpdoctor that dies, or whose stdout is a closed pipe, loses none of it).

An OutputTail follows those files as they grow and hands each complete line on: torchrun's own
lines as they are, a rank's prefixed with its local rank as torchrun's `--tee` would
(`[default0]:...`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddpdoctor.protocol import bounded
from ddpdoctor.protocol.torchrun_logs import RANK_LOG, classify_log_path

POLL_S = 0.1
# How often the log folder is walked for new rank logs (a rank's first line, a restart's new
# attempt): the known files are read every POLL_S, but walking the tree each time cost the
# launcher's CPU, which a job on few cores pays for, to find nothing new.
DISCOVER_EVERY_S = 1.0
READ_BYTES = 1 << 20


class _Follow:
    """One growing file: complete lines from where the last read stopped."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.partial = b""

    def lines(self) -> list[str]:
        try:  # a regular file only: a FIFO or a device in its place never blocks the launcher
            data = bounded.read_bytes(self.path, READ_BYTES, whole=False, offset=self.offset)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        parts = (self.partial + data).split(b"\n")
        self.partial = parts.pop()
        return [p.decode("utf-8", errors="replace").rstrip("\r") for p in parts]

    def rest(self) -> list[str]:
        """The last line without its newline, once the writer has gone."""
        tail, self.partial = self.partial, b""
        return [tail.decode("utf-8", errors="replace")] if tail else []


class OutputTail:
    """Follows torchrun.log (from `start_offset`) and, when `ranks`, the rank logs below
    `log_dir`, in a thread, until `stop()` after the writers have gone."""

    def __init__(
        self,
        agent_log: Path,
        log_dir: Path,
        run_root: Path,
        *,
        start_offset: int,
        on_line: Callable[[str], None] | None,
        on_agent_line: Callable[[str], None] | None,
    ) -> None:
        self._agent = _Follow(agent_log, start_offset)
        self._log_dir = log_dir
        self._run_root = run_root
        self._ranks: dict[str, tuple[_Follow, str]] = {}
        self._on_line = on_line
        self._on_agent_line = on_agent_line
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-output", daemon=True)
        self._next_discovery = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Read what is left and end (call once torchrun has exited)."""
        self._done.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            finishing = self._done.is_set()
            self._read_all()
            if finishing:
                self._emit_rest()
                return
            self._done.wait(POLL_S)

    def _read_all(self) -> None:
        for line in self._agent.lines():
            self._agent_line(line)
        if self._on_line is None:
            return
        now = time.monotonic()
        if now >= self._next_discovery or self._done.is_set():
            self._next_discovery = now + DISCOVER_EVERY_S
            self._discover()
        for follow, prefix in self._ranks.values():
            for line in follow.lines():
                self._on_line(prefix + line)

    def _emit_rest(self) -> None:
        for line in self._agent.rest():
            self._agent_line(line)
        if self._on_line is not None:
            for follow, prefix in self._ranks.values():
                for line in follow.rest():
                    self._on_line(prefix + line)

    def _agent_line(self, line: str) -> None:
        if self._on_agent_line is not None:
            self._on_agent_line(line)
        if self._on_line is not None:
            self._on_line(line)

    def _discover(self) -> None:
        base = self._run_root  # classify_log_path wants the parts below the run directory
        for root, _dirs, files in os.walk(self._log_dir):
            for name in files:
                path = Path(root) / name
                key = str(path)
                if key in self._ranks or not name.endswith(".log"):
                    continue
                try:
                    source = classify_log_path(path.relative_to(base).parts)
                except ValueError:
                    continue
                if source is not None and source.kind == RANK_LOG:
                    self._ranks[key] = (_Follow(path), f"[default{source.local_rank}]:")
