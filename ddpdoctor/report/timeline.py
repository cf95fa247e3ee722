"""A run directory's events as spans on a per-rank timeline: steps, collectives, waits.

- a step: from the end of the rank's previous step (or `step_time_s` before its step event) to
  its step event;
- a collective: collective_start to its collective_end (same op, group and sequence number); a
  start with no end is a wait that never finished, drawn until the rank's last sign of life
  (its last event: a heartbeat, its exit);
- a data wait: the first `data_time_s` of a step (the rank waited for its DataLoader).

Times are the ranks' own clocks (unix seconds), shown relative to the run's first event.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ddpdoctor.protocol import bounded
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.flight_recorder import FrRank
from ddpdoctor.protocol.rundir import RunDir

MAX_EVENTS_PER_RANK = (
    200_000  # a long run is summarized by its first events; the report stays small
)
MAX_SPANS_PER_KIND = 20_000
# What the report reads of all ranks' event files together: a longer file is read at its start
# and at its end (where a hang or a crash is), and the page says the middle was left out.
READ_BUDGET_BYTES = 24 << 20
MIN_READ_PER_RANK = 256 << 10
MAX_LINE_BYTES = 1 << 20  # an events line longer than this is no event of the runtime's
GAP = None  # what _events yields where it skipped the middle of a file


@dataclass(frozen=True)
class Span:
    rank: int
    kind: str  # "step" | "collective" | "wait" | "data" | "stalled" | "attempt"
    name: str  # "step 4", "all_reduce #12", "all_reduce #12 (never completed)"
    start: float  # unix seconds
    end: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class RankTimeline:
    rank: int
    host: str | None = None
    pid: int | None = None
    spans: list[Span] = field(default_factory=list)
    step_times: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds)
    last_t: float | None = None
    exit_code: int | None = None


@dataclass
class Timeline:
    ranks: dict[int, RankTimeline]
    start: float  # the earliest event of any rank (unix seconds)
    skipped: tuple[int, ...] = ()  # ranks whose event files were read at both ends only

    @property
    def spans(self) -> Iterator[Span]:
        for rank in sorted(self.ranks):
            yield from self.ranks[rank].spans


def read_timeline(run: RunDir) -> Timeline:
    """Every rank's events file of a run directory as spans (missing or torn lines skipped),
    within READ_BUDGET_BYTES: each rank gets its share, and a longer file is read at both ends."""
    ranks: dict[int, RankTimeline] = {}
    files = []
    for path in sorted(run.events_dir.glob("rank-*.jsonl")) if run.events_dir.is_dir() else []:
        rank = _rank_of(path)
        if rank is not None:
            files.append((rank, path))
    share = max(MIN_READ_PER_RANK, READ_BUDGET_BYTES // max(1, len(files)))
    skipped = []
    for rank, path in files:
        ranks[rank], cut = _read_rank(rank, path, share)
        if cut:
            skipped.append(rank)
    starts = [s.start for r in ranks.values() for s in r.spans]
    starts += [r.last_t for r in ranks.values() if r.last_t is not None and not r.spans]
    return Timeline(ranks=ranks, start=min(starts, default=0.0), skipped=tuple(skipped))


def _rank_of(path: Path) -> int | None:
    number = path.stem.removeprefix("rank-")
    if not number.isdigit() or len(number) > 9:
        return None
    return int(number)


def _events(path: Path, budget: int, cut: list[bool]) -> Iterator[dict[str, Any] | None]:
    """The events of one file (a regular file only: protocol/bounded.py), at most `budget`
    bytes of it: its first half and its last half when it is longer, GAP between them
    (`cut` is set)."""
    try:
        with bounded.open_regular(path, buffered=True) as stream:
            size = os.fstat(stream.fileno()).st_size
            if size <= budget:
                yield from _lines(stream, size)
                return
            cut.append(True)
            yield from _lines(stream, budget // 2)
            yield GAP
            stream.seek(size - budget // 2)
            stream.readline(MAX_LINE_BYTES)  # the rest of a line cut by the seek
            yield from _lines(stream, budget // 2)
    except OSError:
        return


def _lines(stream: Any, budget: int) -> Iterator[dict[str, Any]]:
    read = 0
    for _ in range(MAX_EVENTS_PER_RANK):
        line = stream.readline(MAX_LINE_BYTES)
        read += len(line)
        if not line or read > budget:
            return
        event = parse_event_line(line)
        if event is not None and _is_time(event.get("t")):
            yield event


def _is_time(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e11


def _read_rank(rank: int, path: Path, budget: int) -> tuple[RankTimeline, bool]:
    out = RankTimeline(rank=rank)
    cut: list[bool] = []
    open_calls: dict[tuple, dict[str, Any]] = {}
    heartbeat_open: dict[str, Any] | None = None  # the collective the latest heartbeat was in
    previous_step_end: float | None = None
    counts: dict[str, int] = {}

    def add(span: Span) -> None:
        if counts.get(span.kind, 0) < MAX_SPANS_PER_KIND:
            counts[span.kind] = counts.get(span.kind, 0) + 1
            out.spans.append(span)

    for event in _events(path, budget, cut):
        if event is GAP:  # the middle of the file was not read: nothing spans the gap
            open_calls.clear()
            heartbeat_open = None
            previous_step_end = None
            continue
        t = float(event["t"])
        out.last_t = t if out.last_t is None else max(out.last_t, t)
        kind = event.get("kind")
        if kind == "hello":
            out.host = event.get("host") or out.host
            out.pid = event.get("pid") if isinstance(event.get("pid"), int) else out.pid
        elif kind == "heartbeat":
            current = event.get("open")
            heartbeat_open = current if isinstance(current, dict) else None
        elif kind == "collective_start":
            open_calls[_call_key(event)] = event
        elif kind == "collective_end":
            start = open_calls.pop(_call_key(event), None)
            if start is not None:
                add(_collective(rank, start, t, event))
        elif kind == "step":
            step = event.get("step")
            took = event.get("step_time_s")
            begin = previous_step_end
            if isinstance(took, int | float) and took > 0:
                begin = t - float(took) if begin is None else max(begin, t - float(took))
            if begin is None or not isinstance(step, int):
                previous_step_end = t
                continue
            add(Span(rank, "step", f"step {step}", begin, t, _step_args(event)))
            data = event.get("data_time_s")
            if isinstance(data, int | float) and data > 0:
                add(Span(rank, "data", f"data wait, step {step}", begin, begin + float(data),
                         {"step": step}))  # fmt: skip
            out.step_times.append((step, t - begin))
            previous_step_end = t
        elif kind == "exit" and isinstance(event.get("code"), int):
            out.exit_code = event["code"]
    end = out.last_t or 0.0
    for start in open_calls.values():
        add(
            Span(
                rank,
                "wait",
                f"{_label(start)} (never completed)",
                float(start["t"]),
                max(end, float(start["t"])),
                _call_args(start),
            )
        )
    # a collective with no start event (DDP's own gradient all-reduce runs in C++): the
    # heartbeat thread saw the rank in it until its last beat
    since = heartbeat_open.get("since_t") if heartbeat_open is not None else None
    beat = heartbeat_open or {}
    if _is_time(since) and _call_key(beat) not in open_calls:
        add(
            Span(rank, "wait", f"{_label(beat)} (never completed)", float(since),
                 max(end, float(since)), _call_args(beat))
        )  # fmt: skip
    out.spans.sort(key=lambda s: s.start)
    return out, bool(cut)


def add_diagnosis_waits(timeline: Timeline, diagnosis: dict[str, Any]) -> None:
    """The collectives diagnosis.json says ranks wait in (from the flight recorder, for DDP's
    C++ all-reduce) as wait spans, for ranks whose events show none."""
    for entry in _entries(diagnosis):
        call = entry.get("collective")
        rank = timeline.ranks.get(entry["rank"])
        if not isinstance(call, dict) or rank is None or rank.last_t is None:
            continue
        if any(s.kind == "wait" for s in rank.spans):
            continue
        waited = call.get("waiting_s")
        if not _is_time(waited) or waited <= 0:
            continue
        start = rank.last_t - float(waited)
        rank.spans.append(
            Span(rank.rank, "wait", f"{_label(call)} (waiting)", start, rank.last_t,
                 _call_args(call))
        )  # fmt: skip
        timeline.start = min(timeline.start, start)


def _entries(diagnosis: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """diagnosis.json's rank entries that have an integer rank (the file may come from anywhere)."""
    ranks = diagnosis.get("ranks")
    for entry in ranks if isinstance(ranks, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("rank"), int):
            yield entry


def _call_key(event: dict[str, Any]) -> tuple:
    """(group, seq, op), each a plain value (a crafted line's list or dict is no key)."""
    return tuple(
        v if v is None or isinstance(v, str | int | float) else "?"
        for v in (event.get("group"), event.get("seq"), event.get("op"))
    )


def _label(event: dict[str, Any]) -> str:
    group = event.get("group")
    where = "" if group in (None, "default") else f" [{group}]"
    return f"{event.get('op', '?')} #{event.get('seq', '?')}{where}"


def _call_args(event: dict[str, Any]) -> dict[str, Any]:
    return {k: event[k] for k in ("op", "seq", "group", "shapes", "dtypes") if k in event}


def _collective(rank: int, start: dict[str, Any], t: float, end: dict[str, Any]) -> Span:
    args = _call_args(start)
    if end.get("ok") is False:
        args["error"] = end.get("error")
    return Span(rank, "collective", _label(start), float(start["t"]), t, args)


def _step_args(event: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "epoch", "loss", "step_time_s", "data_time_s", "compute_time_s", "comm_wait_s")
    return {k: event[k] for k in keys if event.get(k) is not None}


def add_flight_recorder_waits(timeline: Timeline, dumps: list[FrRank]) -> None:
    """Collectives the ranks' flight recorders had pending when dumped (DDP's gradient
    all-reduce has no events of its own) as waits, from when the call was scheduled to the
    dump, for ranks whose events show no wait."""
    for dump in dumps:
        rank = timeline.ranks.get(dump.rank)
        if rank is None or dump.error is not None or dump.taken_t <= 0:
            continue
        if any(s.kind == "wait" for s in rank.spans):
            continue
        for group in dump.groups:
            entry = dump.pending(group.pg)
            if entry is None or entry.created_t is None or entry.created_t > dump.taken_t:
                continue
            where = "" if group.pg == "0" else f" [{group.desc or group.name}]"
            rank.spans.append(
                Span(dump.rank, "wait",
                     f"{entry.op} #{entry.seq}{where} (not completed; flight recorder)",
                     entry.created_t, max(dump.taken_t, rank.last_t or 0.0),
                     {"op": entry.op, "seq": entry.seq, "tensors": entry.tensors()})
            )  # fmt: skip
            timeline.start = min(timeline.start, entry.created_t)


def add_stalls(timeline: Timeline, diagnosis: dict[str, Any]) -> None:
    """The culprit ranks of a hang: from their last progress to the end of the run, no progress."""
    if diagnosis.get("verdict") != "hang":
        return
    listed = diagnosis.get("culprits")
    culprits = {c for c in listed if isinstance(c, int)} if isinstance(listed, list) else set()
    ends = [r.last_t for r in timeline.ranks.values() if r.last_t is not None]
    for entry in _entries(diagnosis):
        if entry["rank"] not in culprits:
            continue
        rank = timeline.ranks.get(entry["rank"])
        since = entry.get("last_progress_t")
        if rank is None or not _is_time(since) or not ends:
            continue
        where = entry.get("last_event") or "its own code"
        rank.spans.append(
            Span(rank.rank, "stalled", f"no progress (culprit of the hang; last: {where})",
                 float(since), max(ends), {"last_event": where})
        )  # fmt: skip


def add_attempts(timeline: Timeline, diagnosis: dict[str, Any]) -> None:
    """A job its launcher restarted (diagnosis.json `attempts`): each attempt as a band under its
    ranks' steps, named by how it ended (the first failure), so a restart shows where it cut."""
    attempts = diagnosis.get("attempts")
    if not isinstance(attempts, dict) or not isinstance(attempts.get("attempts"), list):
        return
    listed = attempts["attempts"]
    ends = [r.last_t for r in timeline.ranks.values() if r.last_t is not None]
    total = attempts.get("total")
    for attempt in listed[:1000]:
        if not isinstance(attempt, dict) or not _is_time(attempt.get("started_t")):
            continue
        end = attempt.get("ended_t")
        end = float(end) if _is_time(end) else max(ends, default=None)
        if end is None:
            continue
        number = attempt.get("attempt")
        failed = [
            e for e in attempt.get("endings") or [] if isinstance(e, dict) and e.get("failed")
        ]
        how = (
            f"failed: rank {failed[0].get('rank')}: {failed[0].get('cause')}"
            if failed
            else "ran on"
        )
        of = f" of {total}" if isinstance(total, int) else ""
        name = f"attempt {number}{of} ({how})"
        for rank in timeline.ranks.values():
            rank.spans.append(
                Span(rank.rank, "attempt", name, float(attempt["started_t"]), end,
                     {"attempt": number})
            )  # fmt: skip
