"""PyTorch's flight recorder, as a rank dumps it: which collective its backend has scheduled,
started and completed, by sequence number, with sizes and dtypes.

torch records every collective of every process group in C++ (a ring buffer of
TORCH_FR_BUFFER_SIZE entries, 2000 by default in torch 2.14), for NCCL and, since torch 2.8 or
so, for gloo too. `torch._C._distributed_c10d._dump_fr_trace_json()` returns it as JSON:

    {"version": "2.10", "pg_config": {name: {"desc", "ranks": "[0, 1]"}},
     "pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective",
                           "last_completed_collective"}},
     "entries": [{"collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name": "gloo:all_reduce",
                  "pg_id", "process_group": [name, desc], "state": "scheduled|started|completed",
                  "retired", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                  "time_created_ns", ...}, ...]}

What gloo records differs from NCCL (seen with torch 2.14.1, tests/fixtures/flight_recorder/):
its entries stay "scheduled" for good (gloo has no start/complete events: "retired" turns true
when the work finished) and its pg_status says -1 for "started"; "last_completed_collective" is
right for both, except that a gloo barrier does not move it. So a collective counts as completed
when it is retired, its number is at most the group's last completed one, or its entry says
"completed" (NCCL); as started when the entry says so (NCCL).

This module only reads: a dump (dict) -> FrRank, and back to JSON for diagnosis.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A rank's answer keeps its latest entries only: enough to show where each group is and to
# compare the calls around the one a hang or mismatch is about, small enough to write in a beat.
KEEP_ENTRIES = 64

# torch's dtype names in the recorder ("Float") -> the names ddpdoctor's events use.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Int": "int32",
    "Long": "int64",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}


def dtype_name(recorded: str) -> str:
    """torch's name for a dtype the recorder wrote in C++ spelling ("Float" -> "float32")."""
    return _DTYPES.get(recorded, recorded.lower())


@dataclass(frozen=True)
class FrEntry:
    """One collective as the backend recorded it."""

    seq: int  # collective_seq_id (p2p_seq_id for a send/recv): per process group
    op: str  # "all_reduce", "barrier", ...
    backend: str  # "gloo", "nccl", ...
    pg: str  # the process group's id in the recorder ("0" is the default group)
    pg_name: str
    pg_desc: str
    state: str  # "scheduled" | "started" | "completed", as the recorder says
    retired: bool
    p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    created_t: float | None  # unix time it was scheduled (the rank's clock)
    # the Python stack that called it, innermost first: (file, line, function); only the
    # pickled dumps carry it (torch's JSON form has no frames, ddpdoctor's answers drop them)
    frames: tuple[tuple[str, int, str], ...] = ()
    timeout_s: float | None = None  # the group's timeout, as recorded with the call

    def tensors(self) -> str:
        """ "float32[4740]" or "float32[8, 4] x2" """
        if not self.input_sizes:
            return "no tensors"
        dtype = dtype_name(self.input_dtypes[0]) if self.input_dtypes else "?"
        shape = ", ".join(str(d) for d in self.input_sizes[0])
        more = f" x{len(self.input_sizes)}" if len(self.input_sizes) > 1 else ""
        return f"{dtype}[{shape}]{more}"

    def describe(self) -> str:
        """ "all_reduce #8 (float32[4740])" """
        return f"{self.op} #{self.seq} ({self.tensors()})"

    def numel(self) -> int:
        return sum(math.prod(s) for s in self.input_sizes)

    def torch_event(self) -> dict[str, Any]:
        """The entry as torch's analyzer (flight_recorder.components.types.Op) reads one."""
        return {
            "profiling_name": f"{self.backend}:{self.op}",
            "state": self.state,
            "process_group": [self.pg_name, self.pg_desc],
            "input_sizes": [list(s) for s in self.input_sizes],
            "output_sizes": [list(s) for s in self.output_sizes],
            "input_dtypes": list(self.input_dtypes),
            "output_dtypes": list(self.output_dtypes),
            "collective_seq_id": 0 if self.p2p else self.seq,
            "p2p_seq_id": self.seq if self.p2p else 0,
            "time_created_ns": int((self.created_t or 0.0) * 1e9),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "op": self.op,
            "pg": self.pg,
            "state": self.state,
            "p2p": self.p2p,
            "input_sizes": [list(s) for s in self.input_sizes],
            "input_dtypes": list(self.input_dtypes),
            "created_t": self.created_t,
        }


@dataclass(frozen=True)
class FrGroup:
    """Where one process group's collectives are on this rank's backend."""

    pg: str
    name: str
    desc: str
    last_enqueued: int  # scheduled (0: none yet)
    last_started: int | None  # None: the backend does not record starts (gloo)
    last_completed: int

    def to_json(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "name": self.name,
            "desc": self.desc,
            "last_scheduled": self.last_enqueued,
            "last_started": self.last_started,
            "last_completed": self.last_completed,
        }


@dataclass(frozen=True)
class FrRank:
    """One rank's flight recorder, as it answered one request (or why it could not)."""

    rank: int
    request_id: str
    taken_t: float  # unix time of the dump (the rank's clock)
    version: str = ""
    groups: tuple[FrGroup, ...] = ()
    entries: tuple[FrEntry, ...] = ()  # the latest KEEP_ENTRIES, oldest first
    error: str | None = None  # "no flight recorder in this torch", ...
    step: int | None = None  # the rank's completed training steps when it took the dump
    # the largest rank list of pg_config: the default group's members. Only that: gloo writes
    # every group under one empty name, so a subgroup's members cannot be read from it.
    world: tuple[int, ...] = ()

    def group(self, pg: str) -> FrGroup | None:
        return next((g for g in self.groups if g.pg == pg), None)

    def entry(self, pg: str, seq: int) -> FrEntry | None:
        for e in reversed(self.entries):
            if e.pg == pg and e.seq == seq and not e.p2p:
                return e
        return None

    def state_of(self, entry: FrEntry) -> str:
        """scheduled / started / completed, from the entry and its group's counters."""
        group = self.group(entry.pg)
        if (
            entry.state == "completed"
            or entry.retired  # the work finished (gloo's barrier leaves last_completed behind)
            or (group is not None and not entry.p2p and entry.seq <= group.last_completed)
        ):
            return "completed"
        if entry.state == "started" or (
            group is not None and group.last_started is not None and entry.seq <= group.last_started
        ):
            return "started"
        return "scheduled"

    def pending(self, pg: str) -> FrEntry | None:
        """The oldest collective of the group scheduled and not completed."""
        for e in self.entries:
            if e.pg == pg and not e.p2p and self.state_of(e) != "completed":
                return e
        return None

    def summary(self) -> str:
        """ "gloo: all_reduce #8 scheduled, not completed (last completed #7)" """
        if self.error:
            return f"no dump: {self.error}"
        parts = []
        for g in self.groups:
            label = "" if g.pg == "0" else f"group {g.desc or g.name}: "
            pending = self.pending(g.pg)
            if pending is not None:
                state = self.state_of(pending)
                text = f"{label}{pending.describe()} {state}, not completed"
                text += f" (last completed #{g.last_completed})"
            else:
                last = self.entry(g.pg, g.last_completed)
                what = last.describe() if last is not None else f"#{g.last_completed}"
                text = f"{label}all completed, last {what}"
            parts.append(text)
        return "; ".join(parts) or "no collectives recorded"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "request_id": self.request_id,
            "taken_t": self.taken_t,
            "version": self.version,
            "error": self.error,
            "summary": self.summary(),
            "groups": [g.to_json() for g in self.groups],
            "pending": [p.to_json() for g in self.groups if (p := self.pending(g.pg))],
            "entries": [e.to_json() for e in self.entries[-8:]],
        }


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(tuple(_int(d) for d in s) for s in value if isinstance(s, list))


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def parse_entry(raw: Mapping[str, Any]) -> FrEntry | None:
    name = raw.get("profiling_name")
    if not isinstance(name, str) or ":" not in name:
        return None
    backend, _, op = name.partition(":")
    op = op.split(" ")[0]  # "send 0->1": the peers are in the name
    group = raw.get("process_group")  # a list in JSON, a tuple in the pickled form
    pg_name, pg_desc = (
        (str(group[0]), str(group[1]))
        if isinstance(group, list | tuple) and len(group) == 2
        else ("", "")
    )
    p2p = bool(raw.get("is_p2p"))
    created = raw.get("time_created_ns")
    return FrEntry(
        seq=_int(raw.get("p2p_seq_id" if p2p else "collective_seq_id")),
        op=op,
        backend=backend,
        pg=str(raw.get("pg_id", pg_name)),
        pg_name=pg_name,
        pg_desc=pg_desc,
        state=str(raw.get("state") or "scheduled"),
        retired=bool(raw.get("retired")),
        p2p=p2p,
        input_sizes=_sizes(raw.get("input_sizes")),
        input_dtypes=_strs(raw.get("input_dtypes")),
        output_sizes=_sizes(raw.get("output_sizes")),
        output_dtypes=_strs(raw.get("output_dtypes")),
        created_t=created / 1e9 if isinstance(created, int) and created > 0 else None,
        frames=_frames(raw.get("frames")),
        timeout_s=timeout / 1000 if isinstance(timeout := raw.get("timeout_ms"), int) else None,
    )


def _frames(value: Any) -> tuple[tuple[str, int, str], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        (str(f.get("filename", "?")), _int(f.get("line")), str(f.get("name", "?")))
        for f in value[:64]
        if isinstance(f, Mapping)
    )


def _config_ranks(config: Any) -> tuple[int, ...]:
    """The longest rank list in pg_config ({name: {"ranks": "[0, 1]"}})."""
    best: tuple[int, ...] = ()
    for group in config.values() if isinstance(config, Mapping) else ():
        text = group.get("ranks") if isinstance(group, Mapping) else None
        if isinstance(text, str) and text.startswith("[") and text.endswith("]"):
            ranks = tuple(_int(r, -1) for r in text[1:-1].split(",") if r.strip())
            if len(ranks) > len(best) and all(r >= 0 for r in ranks):
                best = ranks
    return best


def parse_dump(dump: Any, *, rank: int, request_id: str = "", taken_t: float = 0.0) -> FrRank:
    """A rank's dump (the JSON of _dump_fr_trace_json, or one trimmed by `trim`) -> FrRank;
    ValueError when it is not one."""
    if not isinstance(dump, Mapping) or not isinstance(dump.get("entries", []), list):
        raise ValueError("not a flight recorder dump")
    entries = [
        e for raw in dump.get("entries", []) if isinstance(raw, Mapping) if (e := parse_entry(raw))
    ]
    entries = entries[-KEEP_ENTRIES:]
    names = {e.pg: (e.pg_name, e.pg_desc) for e in entries}
    groups = []
    status = dump.get("pg_status")
    for pg, counters in status.items() if isinstance(status, Mapping) else ():
        if not isinstance(counters, Mapping):
            continue
        started = _int(counters.get("last_started_collective"), -1)
        name, desc = names.get(str(pg), (str(pg), ""))
        groups.append(
            FrGroup(
                pg=str(pg),
                name=name,
                desc=desc,
                last_enqueued=max(0, _int(counters.get("last_enqueued_collective"))),
                last_started=started if started >= 0 else None,
                last_completed=max(0, _int(counters.get("last_completed_collective"))),
            )
        )
    return FrRank(
        rank=rank,
        request_id=request_id,
        taken_t=taken_t,
        version=str(dump.get("version") or ""),
        groups=tuple(sorted(groups, key=lambda g: _int(g.pg, 1 << 30))),
        entries=tuple(entries),
        world=_config_ranks(dump.get("pg_config")),
    )


def trim(dump: Mapping[str, Any], keep: int = KEEP_ENTRIES) -> dict[str, Any]:
    """The parts of a dump an answer carries: the latest `keep` entries (stack frames dropped)."""
    entries = dump.get("entries") or []
    kept = []
    for raw in entries[-keep:] if isinstance(entries, list) else ():
        if isinstance(raw, Mapping):
            kept.append({k: v for k, v in raw.items() if k != "frames"})
    return {
        "version": dump.get("version"),
        "pg_config": dump.get("pg_config") or {},
        "pg_status": dump.get("pg_status") or {},
        "entries": kept,
    }
