"""A node's summary of its own ranks, in RUN_DIR/nodes/node-<N>/summary.json.

When a job spans nodes, each node's launcher reads only its own ranks' event files and, once a
second, replaces this one file with what the others need to know about them. Node 0's launcher,
the other launchers and `ddpdoctor watch` read one summary per node instead of every rank's file,
so the shared file system carries operations in proportion to the nodes, not the ranks.

The summary holds, per rank, the rank's latest events of each kind that makes its state (its
hello, latest heartbeat, latest step, phase, epoch, metrics, warnings, fault, error, exit, the
collectives it has open and its latest few collective events), each with its line number in the
rank's own event file. A reader applies, in line order, the ones newer than what it has applied:
the same events the rank wrote, fewer of the routine ones (every step), so a diagnosis reads the
same. Details (a rank's every event, its stacks, its flight-recorder dump) stay on the node and
are pulled on demand.

    {"schema_version": 1, "node_rank": N, "host": "...", "pid": <launcher pid>, "seq": <count>,
     "t": <unix time written>, "ranks": [{"rank": R, "events": [[line_no, {event}], ...]}, ...]}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir

SCHEMA_VERSION = 1
SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class RankEvents:
    rank: int
    # [line number in the rank's file, event] pairs, as read: see valid_event
    events: Any


@dataclass(frozen=True)
class NodeSummary:
    node_rank: int
    host: str
    pid: int
    seq: int
    t: float
    ranks: tuple[RankEvents, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "node_rank": self.node_rank,
            "host": self.host,
            "pid": self.pid,
            "seq": self.seq,
            "t": self.t,
            "ranks": [
                {"rank": r.rank, "events": [[n, e] for n, e in r.events]} for r in self.ranks
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeSummary:
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a node summary")
        node, seq, t = data.get("node_rank"), data.get("seq"), data.get("t")
        if not (isinstance(node, int) and isinstance(seq, int) and isinstance(t, (int, float))):
            raise ValueError("bad node summary")
        if isinstance(node, bool) or isinstance(seq, bool):
            raise ValueError("bad node summary")
        ranks = []
        for entry in data.get("ranks") or ():
            if not isinstance(entry, Mapping) or not _is_int(entry.get("rank")):
                continue
            events = entry.get("events")
            if not isinstance(events, list):
                continue
            # Each pair is checked where it is used (`valid_event`): most are events a reader
            # has applied already, and a node's summary is read every second.
            ranks.append(RankEvents(entry["rank"], events))
        host = data.get("host")
        pid = data.get("pid")
        host = host if isinstance(host, str) else ""
        pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else 0
        return cls(node, host, pid, seq, float(t), tuple(ranks))


def valid_event(pair: Any, rank: int) -> tuple[int, dict[str, Any]] | None:
    """A summary's `[line, event]` pair as (line, event), if it is one of rank R's events."""
    if type(pair) is not list or len(pair) != 2:
        return None
    line, event = pair
    if (
        not _is_int(line)
        or type(event) is not dict
        or event.get("rank") != rank
        or not isinstance(event.get("kind"), str)
    ):
        return None
    return line, event


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def summary_path(run: RunDir, node_rank: int):
    return run.node_dir(node_rank) / SUMMARY_NAME


def write_node_summary(run: RunDir, summary: NodeSummary) -> None:
    """Replace the node's summary at once (a temporary file renamed: never read half written);
    compact JSON, as it is written every second."""
    path = summary_path(run, summary.node_rank)
    # (plain json: the events were read with json.loads, and only ddpdoctor reads this file)
    text = json.dumps(summary.to_json(), separators=(",", ":"), ensure_ascii=False)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{SUMMARY_NAME}.", dir=path.parent)
    except FileNotFoundError:  # the node's folder is made with its record; not there yet
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{SUMMARY_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def summary_mtime(run: RunDir, node_rank: int) -> int | None:
    """The summary file's change time (ns): one stat, to tell whether to read it again."""
    try:
        return os.stat(summary_path(run, node_rank)).st_mtime_ns
    except OSError:
        return None


def read_node_summary(run: RunDir, node_rank: int) -> NodeSummary | None:
    """Node N's summary, or None when it has none or it cannot be read."""
    try:
        summary = NodeSummary.from_json(jsontext.read(summary_path(run, node_rank)))
    except (OSError, ValueError):
        return None
    return summary if summary.node_rank == node_rank else None
