"""The run directory: the one protocol between the ranks of a job and everything that watches it.

A live job, a post-mortem, a copy mailed in a bug report and many nodes on a shared filesystem all
look the same to a watcher, because everything it knows comes from here:

    RUN_DIR/
      run.json                 what was launched (written by the launcher)
      events/rank-<R>.jsonl    one append-only JSON object per line, per rank (runtime/)
      logs/<host>/...          per-rank stdout/stderr captured by torchrun --log-dir on that host
                               (logs/<host>/node-<N>/... when the job spans nodes: two agents may
                               share a host, so each node's launcher has its own folder)
      nodes/node-<N>/          one folder per node's launcher: node.json (host, pids, how its
                               torchrun ended) and that node's doctor.json
      nccl/                    NCCL_DEBUG_FILE=RUN_DIR/nccl/%h.%p.log
      stacks/<capture>/        py-spy dumps, one JSON file per rank: rank-<R>.json
      requests/                stack-capture requests for launchers on other nodes (<id>.json) and
                               their answers (<id>.node<N>.done), see ddpdoctor/protocol/stack_requests.py
      doctor.json              the preflight report, when run
      diagnosis.json           the monitor's latest verdict
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.errors import UsageError

# Set by the launcher in every rank's environment; the in-rank runtime writes where it points.
ENV_RUN_DIR = "DDPDOCTOR_RUN_DIR"
DEFAULT_PARENT = "ddpdoctor-runs"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def nccl_dir(self) -> Path:
        return self.path / "nccl"

    @property
    def stacks_dir(self) -> Path:
        return self.path / "stacks"

    @property
    def requests_dir(self) -> Path:
        return self.path / "requests"

    @property
    def nodes_dir(self) -> Path:
        return self.path / "nodes"

    @property
    def doctor_json(self) -> Path:
        return self.path / "doctor.json"

    def node_dir(self, node_rank: int) -> Path:
        """The folder of one node's launcher in a job that spans nodes."""
        return self.nodes_dir / f"node-{node_rank}"

    def node_json(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / "node.json"

    def doctor_json_for(self, node_rank: int | None) -> Path:
        """doctor.json of a one-node run, or of node N's preflight when the job spans nodes."""
        return self.doctor_json if node_rank is None else self.node_dir(node_rank) / "doctor.json"

    @property
    def diagnosis_json(self) -> Path:
        return self.path / "diagnosis.json"

    def events_file(self, rank: int) -> Path:
        return self.events_dir / f"rank-{rank}.jsonl"

    def host_logs_dir(self, host: str | None = None) -> Path:
        """torchrun's --log-dir for the agent on `host` (one per node, so nodes never collide)."""
        return self.logs_dir / (host or socket.gethostname())

    def node_logs_dir(self, node_rank: int | None, host: str | None = None) -> Path:
        """torchrun's --log-dir for this launcher: logs/<host>/ on one node, logs/<host>/node-<N>/
        when the job spans nodes (two agents on one host must not share a folder)."""
        base = self.host_logs_dir(host)
        return base if node_rank is None else base / f"node-{node_rank}"

    def nccl_debug_file_pattern(self) -> str:
        """NCCL expands %h (host) and %p (pid) itself."""
        return str(self.nccl_dir / "%h.%p.log")

    @classmethod
    def create(cls, path: str | os.PathLike[str] | None = None) -> RunDir:
        """Make a run directory and its subfolders; a path that cannot be made is a usage error.

        Without a path, a new time-named directory is claimed under ./ddpdoctor-runs. Several
        launchers may create the same explicit path at once (nodes on a shared file system).
        """
        target = Path(path) if path is not None else None
        try:
            if target is None:
                target = claim_default_run_path()
            run = cls(target)
            for sub in (run.path, run.events_dir, run.logs_dir, run.nccl_dir, run.stacks_dir):
                sub.mkdir(parents=True, exist_ok=True)
            _probe_writable(run.path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            where = target if target is not None else Path.cwd() / DEFAULT_PARENT
            raise UsageError(f"cannot create run directory {where}: {reason}") from exc
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunDir:
        """An existing run directory, for watch / explain / post-mortem."""
        target = Path(path)
        if not target.is_dir():
            raise UsageError(f"not a run directory: {target} (no such directory)")
        if not (target / "events").is_dir() and not (target / "run.json").is_file():
            raise UsageError(f"not a run directory: {target} (no run.json and no events/ inside)")
        return cls(target)

    def read_run_json(self) -> dict[str, Any]:
        """run.json, or {} when it is missing or unreadable (a copied directory may lack it)."""
        try:
            data = json.loads(self.run_json.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def claim_default_run_path(now: float | None = None) -> Path:
    """Create and return ./ddpdoctor-runs/<YYYYmmdd-HHMMSS>[-N], a name no other run holds.

    The name is claimed by mkdir itself (no exist_ok): runs started in the same second, even in
    other threads or processes, each get their own directory instead of sharing one.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    parent = Path.cwd() / DEFAULT_PARENT
    parent.mkdir(parents=True, exist_ok=True)
    name, n = stamp, 1
    while True:
        candidate = parent / name
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            name = f"{stamp}-{n}"


def _probe_writable(folder: Path) -> None:
    """Raise OSError unless a file can be created in `folder`.

    The probe file is this caller's own (mkstemp: a random name, O_EXCL): launchers creating the
    same run directory at once must never remove each other's probe.
    """
    fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
    os.close(fd)
    os.unlink(probe)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader never sees half a file: temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
