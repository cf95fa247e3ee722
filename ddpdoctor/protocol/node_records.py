"""What each node's launcher says about itself, in RUN_DIR/nodes/node-<N>/node.json.

When a job spans nodes, one `ddpdoctor run` per node writes into the same run directory. Each
launcher keeps its own record (so none clobbers another's): its host, its pid, its torchrun's pid,
its log folder, and, once it is over, how its torchrun ended and whether it stopped the job.

The record is also how a watcher tells which launcher owns which rank. The node rank given to
`ddpdoctor run --node-rank` is only the launcher's name: with the c10d rendezvous torchrun ignores
it and numbers the nodes itself (GROUP_RANK), so two launchers on one host can swap numbers. A
rank's hello event names its host and its parent process, which is its node's torchrun, so
(host, ppid) finds the record; GROUP_RANK serves only where no record matches (static rendezvous,
where it equals --node-rank).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.jsontext import is_int
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic

SCHEMA_VERSION = 1
# NodeRecord.stopped_for, beside a verdict: the launcher got Ctrl-C or a stop signal (the other
# nodes stop their part with it), or it was killed and its reaper ended its node's part
STOPPED_INTERRUPTED = "interrupted"
STOPPED_LAUNCHER_KILLED = "launcher_killed"
_NODE_FOLDER = re.compile(r"^node-(\d+)$")


@dataclass(frozen=True)
class NodeRecord:
    node_rank: int  # the launcher's --node-rank
    host: str
    launcher_pid: int
    torchrun_pid: int | None = None
    log_dir: str | None = None  # torchrun's --log-dir, relative to the run directory
    nproc: int | None = None
    started_t: float | None = None
    ended_t: float | None = None
    stopped_for: str | None = None  # the verdict this launcher stopped its torchrun for
    exit_code: int | None = None  # the launcher's own exit code
    torchrun_exit_code: int | None = None

    @property
    def ended(self) -> bool:
        return self.ended_t is not None

    def with_(self, **changes: Any) -> NodeRecord:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> NodeRecord:
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a node record")
        node, host, pid = data.get("node_rank"), data.get("host"), data.get("launcher_pid")
        if not is_int(node) or not isinstance(host, str) or not is_int(pid):
            raise ValueError("bad node record")
        return cls(
            node_rank=node,
            host=host,
            launcher_pid=pid,
            torchrun_pid=_opt_int(data.get("torchrun_pid")),
            log_dir=data.get("log_dir") if isinstance(data.get("log_dir"), str) else None,
            nproc=_opt_int(data.get("nproc")),
            started_t=_opt_float(data.get("started_t")),
            ended_t=_opt_float(data.get("ended_t")),
            stopped_for=data.get("stopped_for")
            if isinstance(data.get("stopped_for"), str)
            else None,
            exit_code=_opt_int(data.get("exit_code")),
            torchrun_exit_code=_opt_int(data.get("torchrun_exit_code")),
        )


def _opt_int(value: Any) -> int | None:
    return value if is_int(value) else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def write_node_record(run: RunDir, record: NodeRecord) -> None:
    write_json_atomic(run.node_json(record.node_rank), record.to_json())


def read_node_record(run: RunDir, node_rank: int) -> NodeRecord | None:
    """One node's record, or None when it has none (yet) or it cannot be read."""
    try:
        record = NodeRecord.from_json(jsontext.read(run.node_json(node_rank)))
    except (OSError, ValueError):
        return None
    return record if record.node_rank == node_rank else None


def read_node_records(run: RunDir) -> dict[int, NodeRecord]:
    """Every readable node record of the run, by node rank ({} for a one-node run)."""
    records: dict[int, NodeRecord] = {}
    try:
        with os.scandir(run.nodes_dir) as it:
            folders = [e.name for e in it if e.is_dir()]
    except OSError:
        return records
    for name in folders:
        match = _NODE_FOLDER.match(name)
        if match is None:
            continue
        record = read_node_record(run, int(match.group(1)))
        if record is not None:
            records[record.node_rank] = record
    return records


class NodeRecordReader:
    """Every node's record, read again only when its file was replaced: one stat per node, not
    one read and parse, for a watcher that looks at every node's record once a second. A
    record is written by renaming a new file over it, so its inode tells a new one even where
    the file system keeps times to the second (NFS)."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._known: dict[int, tuple[tuple[int, int, int], NodeRecord]] = {}

    def read_all(self) -> dict[int, NodeRecord]:
        records: dict[int, NodeRecord] = {}
        try:
            with os.scandir(self.run.nodes_dir) as it:
                folders = [e.name for e in it if e.is_dir()]
        except OSError:
            return records
        for name in folders:
            match = _NODE_FOLDER.match(name)
            if match is not None:
                node = int(match.group(1))
                record = self.read(node)
                if record is not None:
                    records[node] = record
        return records

    def read(self, node: int) -> NodeRecord | None:
        try:
            st = os.stat(self.run.node_json(node))
        except OSError:
            self._known.pop(node, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._known.get(node)
        if known is not None and known[0] == key:
            return known[1]
        record = read_node_record(self.run, node)
        if record is None:
            self._known.pop(node, None)
        else:
            self._known[node] = (key, record)
        return record


def node_of(
    records: Mapping[int, NodeRecord],
    *,
    host: str | None,
    ppid: int | None,
    group_rank: int | None,
) -> int | None:
    """The node (launcher) a rank belongs to: the record of its parent torchrun, else GROUP_RANK."""
    if host is not None and ppid is not None:
        for record in records.values():
            if record.torchrun_pid == ppid and record.host == host:
                return record.node_rank
    return group_rank


def say_launcher_killed(run: RunDir, node_rank: int, ended_t: float) -> None:
    """The reaper's note, in its node's record, that the launcher died while its part of the
    job ran and the reaper ended that part (never raises)."""
    with contextlib.suppress(OSError, ValueError):
        record = read_node_record(run, node_rank)
        if record is not None and not record.ended:
            write_node_record(
                run, record.with_(stopped_for=STOPPED_LAUNCHER_KILLED, ended_t=ended_t)
            )


class NodeRecorder:
    """The launcher's own record, kept up to date as its part of the job starts, stops and ends."""

    def __init__(self, run: RunDir, record: NodeRecord) -> None:
        self.run = run
        self.record = record

    def _write(self, **changes: Any) -> None:
        self.record = self.record.with_(**changes)
        with contextlib.suppress(OSError):  # a record lost is a view less, not a failed job
            write_node_record(self.run, self.record)

    def started(self, torchrun_pid: int | None, started_t: float) -> None:
        self._write(torchrun_pid=torchrun_pid, started_t=started_t)

    def stopped(self, verdict: str) -> None:
        """This launcher stops its torchrun for `verdict`: the other launchers follow."""
        self._write(stopped_for=verdict)

    def ended(self, exit_code: int, torchrun_exit_code: int | None, ended_t: float) -> None:
        self._write(ended_t=ended_t, exit_code=exit_code, torchrun_exit_code=torchrun_exit_code)
