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
same. A rank its node judges routine has a row instead of events (`rows`, column by column: a value
the node's ranks share is written once): its state as its node's tracker folded it
(ddpdoctor.monitor.follow.rank_rows), its calls as indices into the node's call table (`calls`), so a
reader of 1000s of ranks copies a row per rank instead of replaying events. Details (a rank's
every event, its stacks, its flight-recorder dump) stay on the node and are pulled on demand.

The file has two lines. The first, the head, is what a reader that keeps up needs: per rank the
last line the summary covers (`last`), the last line the previous summary covered (`after`) and
the events between them. The second holds every rank's whole digest, for a reader that is behind
(it started late, missed a summary, or just began to follow a rank): it parses the second line
only then, so a reader in step parses a few events per rank a second, not the whole state.

    {"schema_version": 3, "node_rank": N, "host": "...", "pid": <launcher pid>, "seq": <count>,
     "t": <unix time written>, "calls": [[op, group, seq, ...], ...], "waits": [[t, s], ...],
     "rows": {"rank": [R, ...], "last": [L, ...], "after": [A, ...],
              "same": {column: value}, "each": {column: [value per rank]}},
     "ranks": [{"rank": R, "last": L, "after": A, "events": [[line_no, {event}], ...]}, ...],
     "gone": [R, ...]}
    {"ranks": [{"rank": R, "events": [[line_no, {event}], ...]}, ...]}

`gone` (optional): the node's ranks whose process its watcher saw end without an exit event (a
node that sees its ranks' processes: the Ray relay's node actor, ddpdoctor/launch/ray_relay.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from ddpdoctor.protocol import bounded, jsontext
from ddpdoctor.protocol.rundir import RunDir

SCHEMA_VERSION = 3
SUMMARY_NAME = "summary.json"
MAX_SUMMARY_BYTES = 64 << 20
HEAD_READ = 8 << 10  # the first read of a summary: its head, for 8 routine ranks and more
MAX_GONE = 4096  # ranks a summary may name as gone (a node has a few)


@dataclass(frozen=True)
class RankEvents:
    rank: int
    # [line number in the rank's file, event] pairs, as read: see valid_event
    events: Any
    # the head's bounds: the events cover the rank's lines after `after` up to `last`
    last: int = 0
    after: int = 0


@dataclass(frozen=True)
class NodeSummary:
    """One summary as read: its head (`ranks`: what is new since the previous summary), and
    `full`, every rank's whole digest, parsed on first use."""

    node_rank: int
    host: str
    pid: int
    seq: int
    t: float
    ranks: tuple[RankEvents, ...]
    rest: bytes = b""  # the second line, unparsed (or its start: see `source`)
    # its routine ranks' rows, column by column, checked where applied (row_reader.NodeRows)
    rows: Any = None
    calls: Any = None  # the node's call table, which its rows' calls index (rank_rows)
    # (start t, duration) of the collectives its routine ranks finished since its last summary
    waits: Any = None
    # (path, inode, size) of the file, when only the head was read: `full()` reads the rest
    # from there, if the file is still that one (a reader in step never needs it)
    source: tuple[str, int, int] | None = None
    gone: tuple[int, ...] = ()  # ranks whose process its node saw end without an exit event

    def row_ranks(self) -> list[int]:
        """The ranks the summary has a row of (their events are in `full` only)."""
        ranks = self.rows.get("rank") if isinstance(self.rows, Mapping) else None
        return [r for r in ranks if _is_int(r)] if isinstance(ranks, list) else []

    def all_ranks(self) -> tuple[int, ...]:
        """Every rank the summary speaks of, by events or by row."""
        return tuple(sorted({r.rank for r in self.ranks} | set(self.row_ranks())))

    def full(self) -> tuple[RankEvents, ...] | None:
        """Every rank's whole digest (None when the second line is missing or torn)."""
        rest = self.rest if self.source is None else _rest_of(self.source)
        if rest is None:
            return None  # replaced by a newer summary since: the next poll reads that one
        try:
            data = jsontext.loads(rest)
        except ValueError:
            return None
        if not isinstance(data, Mapping):
            return None
        bounds = {r.rank: r for r in self.ranks}
        out = []
        for rank, events in _rank_entries(data.get("ranks")):
            head = bounds.get(rank)
            out.append(RankEvents(rank, events, head.last if head else 0, 0))
        return tuple(out)

    @classmethod
    def from_head(
        cls, data: Any, rest: bytes = b"", source: tuple[str, int, int] | None = None
    ) -> NodeSummary:
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a node summary")
        node, seq, t = data.get("node_rank"), data.get("seq"), data.get("t")
        if not (_is_int(node) and _is_int(seq) and jsontext.is_number(t)):
            raise ValueError("bad node summary")
        ranks = []
        for entry in data.get("ranks") or ():
            if not isinstance(entry, Mapping) or not _is_int(entry.get("rank")):
                continue
            last, after = entry.get("last"), entry.get("after", 0)
            events = entry.get("events", [])
            if not (_is_int(last) and _is_int(after) and isinstance(events, list)):
                continue
            # Each pair is checked where it is used (`valid_event`).
            ranks.append(RankEvents(entry["rank"], events, last, after))
        host, pid = data.get("host"), data.get("pid")
        gone = data.get("gone")
        gone_ranks = (
            tuple(r for r in gone[:MAX_GONE] if _is_int(r)) if isinstance(gone, list) else ()
        )
        return cls(
            node,
            host if isinstance(host, str) else "",
            pid if _is_int(pid) else 0,
            seq,
            float(t),
            tuple(ranks),
            rest,
            data.get("rows"),
            data.get("calls"),
            data.get("waits"),
            source,
            gone_ranks,
        )


def _rank_entries(value: Any) -> Iterable[tuple[int, list]]:
    for entry in value if isinstance(value, list) else ():
        if isinstance(entry, Mapping) and _is_int(entry.get("rank")):
            events = entry.get("events")
            if isinstance(events, list):
                yield entry["rank"], events


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


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def summary_path(run: RunDir, node_rank: int):
    return run.node_dir(node_rank) / SUMMARY_NAME


@functools.lru_cache(maxsize=8192)
def _summary_file(run_path: os.PathLike[str], node_rank: int) -> str:
    """The summary's path as text, made once per node: readers stat it every poll, for every
    node, and building it as a Path each time was a tenth of node 0's work per node."""
    return os.path.join(run_path, "nodes", f"node-{node_rank}", SUMMARY_NAME)


def write_summary_text(run: RunDir, node_rank: int, text: str) -> None:
    """Replace the node's summary at once (a temporary file renamed: never read half written).
    `text`: the two lines, made by the publisher (ddpdoctor.monitor.follow.node_summaries), which
    encodes each event once, not once a second."""
    path = summary_path(run, node_rank)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{SUMMARY_NAME}.", dir=path.parent)
    except FileNotFoundError:  # the node's folder is made with its record; not there yet
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{SUMMARY_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def summary_stamp(run: RunDir, node_rank: int) -> tuple[int, int, int] | None:
    """(inode, change time in ns, size) of the summary file: one stat, to tell whether to read
    it again. Each summary is a new file renamed over the last, so its inode tells a new one
    even where the file system keeps times to the second (NFS)."""
    try:
        st = os.stat(_summary_file(run.path, node_rank))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_node_summary(run: RunDir, node_rank: int) -> NodeSummary | None:
    """Node N's summary (its head parsed, the rest kept for `full()`), or None when it has none
    or its head cannot be read. Only the head is read where it fits the first block: the
    second line, every rank's whole digest, is most of the file and rarely needed."""
    path = _summary_file(run.path, node_rank)
    try:
        with bounded.open_regular(path) as fh:  # never a FIFO or a device: node 0 would block
            data = bounded.read_all(fh, HEAD_READ)
            head, newline, rest = data.partition(b"\n")
            source = None
            if not newline:  # a head longer than the first block: the whole file, then
                data += bounded.read_all(fh, MAX_SUMMARY_BYTES - len(data))
                head, _, rest = data.partition(b"\n")
            elif len(data) == HEAD_READ:  # more of the second line than this block
                st = os.fstat(fh.fileno())
                source = (path, st.st_ino, st.st_size)
        summary = NodeSummary.from_head(jsontext.loads(head), rest, source)
    except (OSError, ValueError):
        return None
    return summary if summary.node_rank == node_rank else None


def _rest_of(source: tuple[str, int, int]) -> bytes | None:
    """The second line of the summary file `source` names, if the file is still that one."""
    path, inode, size = source
    try:
        with bounded.open_regular(path) as fh:
            st = os.fstat(fh.fileno())
            if (st.st_ino, st.st_size) != (inode, size):
                return None
            data = bounded.read_all(fh, MAX_SUMMARY_BYTES)
    except OSError:
        return None
    return data.partition(b"\n")[2]
