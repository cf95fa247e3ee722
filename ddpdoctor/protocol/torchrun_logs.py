"""What the log files of a run directory are, and what torchrun's own log says about exits.

torchrun --log-dir writes `logs/<host>/<run-id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`
(the launcher gives each host its own folder, and each node its own below it when the job spans
nodes: `logs/<host>/node-<N>/...`, since two agents may share a host); the launcher saves torchrun's
own output to `logs/<host>[/node-<N>]/torchrun.log`; NCCL writes `nccl/<host>.<pid>.log`. A local
rank maps to a global rank through the hello events (host [+ node] + local_rank), an NCCL log
through (host + pid).

torchrun's failure table (ChildFailedError) gives each failed rank's exit code, pid and the signal
that ended it. Its "Root Cause (first observed failure)" is the exit the agent noticed first, which
is often a victim, so the monitor uses these facts for exit codes and signals, not for blame.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

RANK_LOG = "rank"
AGENT_LOG = "agent"
NCCL_LOG = "nccl"
OTHER_LOG = "other"

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_NODE = re.compile(r"^node-(\d+)$")


@dataclass(frozen=True)
class LogSource:
    """One log file, as its path describes it (relative to the run directory)."""

    rel: str
    kind: str  # RANK_LOG | AGENT_LOG | NCCL_LOG | OTHER_LOG
    host: str | None = None
    local_rank: int | None = None
    stream: str | None = None  # "stdout" | "stderr" for rank logs
    attempt: int | None = None
    pid: int | None = None  # NCCL logs are named by the rank's pid
    node: int | None = None  # the launcher's node rank, for a job that spans nodes

    @property
    def agent_key(self) -> str:
        """Which torchrun agent wrote it: "vm", or "vm node 1" when agents share a host."""
        host = self.host or ""
        return host if self.node is None else f"{host} node {self.node}"

    def label(self, rank: int | None) -> str:
        """How the logs panel names the source: "rank 1 stderr", "nccl vm.1234", "torchrun vm"."""
        if self.kind == RANK_LOG:
            who = f"rank {rank}" if rank is not None else f"local rank {self.local_rank}"
            return f"{who} {self.stream}"
        if self.kind == NCCL_LOG:
            return f"nccl {self.host}.{self.pid}"
        if self.kind == AGENT_LOG:
            return f"torchrun {self.agent_key}"
        return self.rel


def classify_log_path(parts: tuple[str, ...]) -> LogSource | None:
    """The LogSource for a path's parts relative to the run directory, or None if it is no log."""
    if not parts or not parts[-1].endswith(".log"):
        return None
    rel = "/".join(parts)
    if parts[0] == "nccl" and len(parts) == 2:
        stem = parts[1][: -len(".log")]
        host, _, pid = stem.rpartition(".")
        if host and pid.isdigit():
            return LogSource(rel, NCCL_LOG, host=host, pid=int(pid))
        return LogSource(rel, OTHER_LOG)
    if parts[0] != "logs" or len(parts) < 3:
        return LogSource(rel, OTHER_LOG) if parts[0] in ("logs", "nccl") else None
    host = parts[1]
    node_match = _NODE.match(parts[2]) if len(parts) > 3 else None
    node = int(node_match.group(1)) if node_match else None
    inner = parts[3:] if node_match else parts[2:]  # below the agent's own folder
    if len(inner) == 1 and inner[0] == "torchrun.log":
        return LogSource(rel, AGENT_LOG, host=host, node=node)
    if len(inner) >= 3 and parts[-1] in ("stdout.log", "stderr.log") and parts[-2].isdigit():
        match = _ATTEMPT.match(parts[-3])
        return LogSource(
            rel,
            RANK_LOG,
            host=host,
            local_rank=int(parts[-2]),
            stream=parts[-1][: -len(".log")],
            attempt=int(match.group(1)) if match else None,
            node=node,
        )
    return LogSource(rel, OTHER_LOG, host=host, node=node)


def signal_name(exit_code: int | None) -> str | None:
    """SIGKILL for -9 (how torchrun and subprocess report a signal), also 128+N from a shell."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class AgentExit:
    """One rank's exit as torchrun reported it."""

    rank: int | None
    local_rank: int | None
    exit_code: int
    pid: int | None
    host: str | None = None  # torchrun's own idea of the host (may be "localhost")
    root_cause: bool = False  # listed under "Root Cause (first observed failure)"
    line_no: int | None = None

    @property
    def signal(self) -> str | None:
        return signal_name(self.exit_code)


_FAILED_LINE = re.compile(
    r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)"
)  # E... api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 8462) of binary: ...
_SIGTERM_LINE = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")
_TABLE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_TABLE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_TABLE_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")


class AgentLogParser:
    """Reads torchrun's output line by line and collects what it says about ranks' exits."""

    def __init__(self) -> None:
        self.exits: dict[int, AgentExit] = {}  # by pid (ranks are not always known)
        self.signalled_pids: dict[int, str] = {}  # pids torchrun sent a signal to (SIGTERM)
        self._in_root_cause = False
        self._entry: dict[str, object] = {}

    def feed(self, line: str, line_no: int | None = None) -> None:
        if "exitcode" in line or "local_rank" in line or "host" in line or "Root Cause" in line:
            self._table_line(line, line_no)
        if "closing signal" in line:
            match = _SIGTERM_LINE.search(line)
            if match:
                self.signalled_pids[int(match.group(1))] = match.group(2)
        if "failed (exitcode" in line:
            match = _FAILED_LINE.search(line)
            if match:
                pid = int(match.group(3))
                if pid not in self.exits:
                    self.exits[pid] = AgentExit(
                        rank=None,
                        local_rank=int(match.group(2)),
                        exit_code=int(match.group(1)),
                        pid=pid,
                        line_no=line_no,
                    )

    def _table_line(self, line: str, line_no: int | None) -> None:
        if "Root Cause" in line:
            self._in_root_cause = True
            return
        if line.startswith("Failures:"):
            self._in_root_cause = False
        match = _TABLE_HOST.match(line)
        if match:
            self._entry = {"host": match.group(1)}
            return
        match = _TABLE_RANK.match(line)
        if match:
            self._entry["rank"] = int(match.group(1))
            self._entry["local_rank"] = int(match.group(2))
            return
        match = _TABLE_EXIT.match(line)
        if match and "rank" in self._entry:
            pid = int(match.group(2))
            self.exits[pid] = AgentExit(
                rank=int(str(self._entry["rank"])),
                local_rank=int(str(self._entry["local_rank"])),
                exit_code=int(match.group(1)),
                pid=pid,
                host=str(self._entry.get("host")),
                root_cause=self._in_root_cause,
                line_no=line_no,
            )
            self._entry = {}
