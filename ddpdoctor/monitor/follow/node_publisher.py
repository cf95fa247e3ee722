"""What a node's launcher publishes about its own ranks: its summary, once a second.

Each launcher of a job that spans nodes reads its own ranks' event files and folds them into its
records of them; `Publisher` keeps, per rank, the events that make its state (`RankDigest`) and
writes the node's summary (ddpdoctor/protocol/node_summary.py): a routine rank as a row made from
its record (ddpdoctor.monitor.follow.rank_rows), every other rank as its events new since the previous
summary, and every rank's whole digest on the second line. The other watchers read it
(ddpdoctor.monitor.follow.node_summaries).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.follow.rank_rows import encode_rows, rows_of
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.node_summary import SCHEMA_VERSION as SUMMARY_SCHEMA
from ddpdoctor.protocol.node_summary import write_summary_text
from ddpdoctor.protocol.rundir import RunDir

PUBLISH_EVERY_S = 1.0
RECENT_COLLECTIVE_EVENTS = 16  # collective events kept per rank (the mismatch comparison)
# Finished collectives' waits a summary carries for its routine ranks: a sample for the adaptive
# thresholds, which keep the latest 1024 of the run (a watcher folds in those of the ranks it
# reads events of itself). At 1000s of nodes a few per node are already more than it keeps.
WAITS_PER_RANK = 2
WAITS_PER_SUMMARY = 8

# The kinds where only the latest event matters to a watcher's state of the rank. (A Ray
# worker's `ray_call`: whether its user's code runs, the difference between a worker that
# stalls in it and one waiting for its next call, or one that died in it and one Ray ended.)
_LATEST = frozenset(
    {
        ev.HELLO,
        ev.HEARTBEAT,
        ev.STEP,
        ev.PHASE,
        ev.EPOCH,
        ev.METRICS,
        ev.FAULT,
        ev.ERROR,
        ev.EXIT,
        ev.RAY_CALL,
    }
)
_COLLECTIVE = frozenset({ev.COLLECTIVE_START, ev.COLLECTIVE_END})

Line = tuple[int, dict[str, Any]]


class RankDigest:
    """The events of one rank that a summary carries: its state, not its history."""

    __slots__ = ("collectives", "latest", "opens", "warnings")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.latest: dict[str, Line] = {}
        self.warnings: dict[str, Line] = {}
        self.opens: dict[tuple[Any, Any, Any], Line] = {}  # open collectives by (group, seq, peer)
        self.collectives: deque[Line] = deque(maxlen=RECENT_COLLECTIVE_EVENTS)

    def note(self, line_no: int, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind in _LATEST:
            hello = self.latest.get(ev.HELLO)
            if kind == ev.HELLO and hello is not None and event.get("pid") != hello[1].get("pid"):
                self._clear()  # a restarted rank: a new attempt, as the tracker sees it
            self.latest[kind] = (line_no, event)
        elif kind in _COLLECTIVE:
            self.collectives.append((line_no, event))
            key = (event.get("group"), event.get("seq"), event.get("peer"))
            if kind == ev.COLLECTIVE_START:
                self.opens[key] = (line_no, event)
            else:
                self.opens.pop(key, None)
        elif kind == ev.WARNING:
            code = str(event.get("code"))
            if code in self.warnings or len(self.warnings) < 16:
                self.warnings[code] = (line_no, event)

    def lines(self) -> tuple[Line, ...]:
        found: dict[int, dict[str, Any]] = {}
        for group in (self.latest.values(), self.warnings.values(), self.opens.values()):
            for n, e in group:
                found[n] = e
        for n, e in self.collectives:
            found[n] = e
        return tuple(sorted(found.items(), key=lambda item: item[0]))


class Publisher:
    """Node N's launcher: digests its own ranks' events, writes its summary once a second.

    Each event is encoded to JSON once, when first published, and kept with its digest: the
    summary is rewritten every second, mostly of events already written in the previous one.
    Given its watcher's trackers, it publishes a routine rank's row instead of its events
    (ddpdoctor.monitor.follow.rank_rows); the second line keeps every rank's digest either way."""

    def __init__(self, run: RunDir, node_rank: int) -> None:
        self.run = run
        self.node_rank = node_rank
        self.digests: dict[int, RankDigest] = {}
        self.published: dict[int, int] = {}  # rank -> the last line its previous summary had
        self.texts: dict[int, dict[int, str]] = {}  # rank -> line -> the event as JSON
        # rank -> (start t, duration) of its collectives finished since the last summary
        self.waits: dict[int, list[tuple[float, float]]] = {}
        self.seq = 0
        self.written_t: float | None = None
        self.host = this_host()
        self.error: str | None = None

    def note(self, rank: int, line_no: int, event: dict[str, Any]) -> None:
        digest = self.digests.get(rank)
        if digest is None:
            digest = self.digests[rank] = RankDigest()
            self.published.pop(rank, None)  # (a digest started again: its head starts at 0)
        digest.note(line_no, event)
        if event["kind"] == ev.COLLECTIVE_END and event.get("ok", True) is not False:
            t, duration = event.get("t"), event.get("duration_s")
            if jsontext.is_number(t) and jsontext.is_number(duration):
                waits = self.waits.setdefault(rank, [])
                if len(waits) < WAITS_PER_RANK:
                    waits.append((t - duration, duration))

    def forget(self, rank: int) -> None:
        self.digests.pop(rank, None)
        self.published.pop(rank, None)
        self.texts.pop(rank, None)
        self.waits.pop(rank, None)

    def maybe_publish(
        self,
        now: float,
        own: Iterable[int],
        *,
        force: bool = False,
        trackers: Mapping[int, RankTracker] | None = None,
    ) -> bool:
        if not force and self.written_t is not None and 0 <= now - self.written_t < PUBLISH_EVERY_S:
            return False
        self.written_t = now
        text = self.compose(now, own, trackers=trackers)
        try:
            write_summary_text(self.run, self.node_rank, text)
            self.error = None
        except OSError as exc:  # a summary lost: the others read this node's files instead
            self.error = exc.strerror or str(exc)
        return True

    def compose(
        self,
        now: float,
        own: Iterable[int],
        *,
        trackers: Mapping[int, RankTracker] | None = None,
        extra_head: Mapping[str, Any] | None = None,
    ) -> str:
        """The next summary's text (its two lines); `extra_head`: more fields for its head."""
        self.seq += 1
        own = sorted(own)
        table, rows = rows_of(trackers, own) if trackers is not None else (None, {})
        heads: list[str] = []
        fulls: list[str] = []
        routine: list[tuple[int, int, int, list[Any]]] = []
        waits: list[tuple[float, float]] = []
        for rank in own:
            digest = self.digests.get(rank)
            if digest is None:
                continue
            lines = digest.lines()
            known = self.texts.get(rank, {})
            texts = {n: known.get(n) or _event_text(e) for n, e in lines}
            self.texts[rank] = texts
            last = lines[-1][0] if lines else 0
            after = self.published.get(rank, 0)
            self.published[rank] = last
            row = rows.get(rank)
            if row is not None:
                routine.append((rank, last, after, row))
                waits.extend(self.waits.pop(rank, ()))
            else:
                new = ",".join(f"[{n},{texts[n]}]" for n, _ in lines if n > after)
                heads.append(f'{{"rank":{rank},"last":{last},"after":{after},"events":[{new}]}}')
                self.waits.pop(rank, None)  # (a watcher folds its events in, waits included)
            every = ",".join(f"[{n},{texts[n]}]" for n, _ in lines)
            fulls.append(f'{{"rank":{rank},"events":[{every}]}}')
        extra = ""
        if table is not None and routine:
            extra = (
                ","
                + json.dumps(
                    {
                        "calls": table.encode(),
                        "waits": waits[:WAITS_PER_SUMMARY],
                        "rows": encode_rows(routine),
                    },
                    separators=(",", ":"),
                    ensure_ascii=False,
                )[1:-1]
            )
        for key, value in (extra_head or {}).items():
            extra += f",{json.dumps(key)}:{json.dumps(value, separators=(',', ':'))}"
        return (
            f'{{"schema_version":{SUMMARY_SCHEMA},"node_rank":{self.node_rank},'
            f'"host":{json.dumps(self.host, ensure_ascii=False)},"pid":{os.getpid()},'
            f'"seq":{self.seq},"t":{json.dumps(now)}{extra},"ranks":[{",".join(heads)}]}}\n'
            f'{{"ranks":[{",".join(fulls)}]}}\n'
        )


def _event_text(event: dict[str, Any]) -> str:
    # (plain json: the events were read with json.loads, and only ddpdoctor reads this file)
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)
