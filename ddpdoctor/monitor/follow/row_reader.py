"""Rank rows as a watcher reads them: a node's rows copied onto its ranks' trackers, column by
column, every value checked on the way in (the rows are read from the shared run directory, and
a row that does not hold what a row must leaves its rank to its events).

The publishing side, what a row holds and how a node writes its rows, is
ddpdoctor.monitor.follow.rank_rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ddpdoctor.monitor.follow.rank_rows import (
    ACTIVITY_STATES,
    MAX_WARNINGS,
    ROW_FIELDS,
    CallKey,
)
from ddpdoctor.monitor.model.event_fields import integer, num, text
from ddpdoctor.monitor.model.own_lines import contradict
from ddpdoctor.monitor.model.progress import Judgement
from ddpdoctor.monitor.model.rank_tracker import RECENT_COLLECTIVES, RankTracker
from ddpdoctor.monitor.model.snapshot import CallSite, CollectiveView

# -- the watcher ----------------------------------------------------------------------------


class CallRecords:
    """A node summary's call table as call records, made once per summary and shared by its
    ranks; a call its previous summary had too keeps its record. `keys`: the fingerprint of
    each distinct list of calls (RankTracker.calls_key), by the list's identity."""

    def __init__(self, value: Any, previous: CallRecords | None = None) -> None:
        known = previous.by_key if previous is not None else {}
        # the decoded `what` of each distinct call text, kept from summary to summary
        self.whats: dict[str, _What | None] = previous.whats if previous is not None else {}
        if len(self.whats) > MAX_WHATS:
            self.whats = {}
        self.by_key: dict[Any, tuple[list[Any], CollectiveView | None]] = {}
        self.calls: list[CollectiveView | None] = []
        for item in value if isinstance(value, list) else ():
            # (group, seq) as a key only where they are what a call's are: a crafted summary's
            # lists there would not hash
            key = None
            if type(item) is list and len(item) > 2 and type(item[1]) is str:
                key = (item[1], item[2]) if type(item[2]) is int else None
            before = known.get(key)
            # the same call as in the previous summary: the same record
            same = before is not None and before[0] == item
            call = before[1] if same else self._call(item)  # type: ignore[index]
            if key is not None:
                self.by_key[key] = (item, call)
            self.calls.append(call)
        self.keys: dict[int, int] = {}

    def _call(self, item: Any) -> CollectiveView | None:
        if type(item) is not list or len(item) != 6:
            return None
        op, group, seq, since, waited, text_ = item
        if text(op) is None or text(group) is None or integer(seq) is None:
            return None
        if not isinstance(text_, str):
            return None
        if text_ not in self.whats:
            self.whats[text_] = _what(text_)
        what = self.whats[text_]
        if what is None:
            return None
        shapes, dtypes, members, site = what
        return CollectiveView(
            op,
            seq,
            num(waited) or 0.0,
            group=group,
            shapes=shapes,
            dtypes=dtypes,
            since_t=num(since),
            group_ranks=members,
            done=True,
            site=site,
        )

    def get(self, i: Any) -> CollectiveView | None:
        if type(i) is int and 0 <= i < len(self.calls):
            return self.calls[i]
        return None

    def resolve(self, indices: Any) -> tuple[CollectiveView, ...] | None:
        """The calls a row's indices name (None when one does not resolve)."""
        if not isinstance(indices, list):
            return None
        calls = []
        for i in indices:
            call = self.get(i)
            if call is None:
                return None
            calls.append(call)
        return tuple(calls[-RECENT_COLLECTIVES:])

    def opens(self, value: Any) -> dict[CallKey, CollectiveView]:
        """A row's open calls: (index, since when this rank waits in it) pairs."""
        out: dict[CallKey, CollectiveView] = {}
        for pair in value if isinstance(value, list) else ():
            if type(pair) is not list or len(pair) != 2:
                continue
            call = self.get(pair[0])
            if call is None:
                continue
            out[(call.group, call.seq)] = CollectiveView(
                call.op,
                call.seq,
                0.0,
                group=call.group,
                shapes=call.shapes,
                dtypes=call.dtypes,
                since_t=num(pair[1]),
                group_ranks=call.group_ranks,
                site=call.site,
            )
        return out


# (shapes, dtypes, members, site) of a call, as its `what` text says
_What = tuple[tuple[tuple[int, ...], ...], tuple[str, ...], tuple[int, ...] | None, CallSite | None]
MAX_WHATS = 4096  # distinct call texts a reader keeps per node (a job makes a few dozen)


def _what(value: str) -> _What | None:
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if type(data) is not list or len(data) != 4:
        return None
    shapes, dtypes, members, site = data
    return (
        tuple(
            tuple(s)
            for s in (shapes if isinstance(shapes, list) else ())
            if isinstance(s, list) and all(integer(d) is not None for d in s)
        ),
        tuple(str(d) for d in (dtypes if isinstance(dtypes, list) else ()) if d),
        tuple(m for m in members if integer(m) is not None) if isinstance(members, list) else None,
        _site_from_row(site),
    )


def _site_from_row(value: Any) -> CallSite | None:
    if type(value) is not list or len(value) != 6:
        return None
    user, via, issuer, file, line, deferred = value
    if not (isinstance(user, str) and isinstance(via, str) and isinstance(issuer, str)):
        return None
    return CallSite(
        user,
        via,
        issuer,
        file=file if isinstance(file, str) else "",
        line=integer(line),
        deferred=deferred is True,
    )


class NodeRows:
    """A node summary's rows as read: which ranks, and each column's value for the i-th."""

    def __init__(self, value: Any) -> None:
        self.ranks: list[int] = []
        self.last: list[int] = []
        self.same: dict[str, Any] = {}
        self.each: dict[str, list[Any]] = {}
        if not isinstance(value, dict):
            return
        ranks, last = value.get("rank"), value.get("last")
        same, each = value.get("same"), value.get("each")
        if not (isinstance(ranks, list) and isinstance(last, list) and len(ranks) == len(last)):
            return
        if not (isinstance(same, dict) and isinstance(each, dict)):
            return
        if not all(type(r) is int and type(n) is int for r, n in zip(ranks, last, strict=True)):
            return
        self.ranks, self.last, self.same = ranks, last, same
        self.each = {
            name: column
            for name, column in each.items()
            if isinstance(column, list) and len(column) == len(ranks)
        }

    def value(self, name: str, i: int) -> Any:
        if name in self.same:
            return self.same[name]
        column = self.each.get(name)
        return None if column is None else column[i]


# What each plain column's values must be (anything else reads as unknown: None).
_KINDS = {
    integer: (int,),
    num: (float, int),
    text: (str,),
}
_COLUMN_KINDS = tuple((name, _KINDS[check]) for name, check in ROW_FIELDS if name != "pid")

_NUMBER = _KINDS[num]


def apply_rows(
    targets: list[tuple[int, RankTracker]], rows: NodeRows, records: CallRecords
) -> list[RankTracker]:
    """Copy a node's rows onto its ranks' trackers: `targets` (i, tracker), the i-th row for
    each (its pid checked already). Returns the trackers it changed: a rank whose calls do not
    resolve in the node's call table is left alone (its events are read instead).

    This runs for every rank of every other node once a second: a column its ranks share is
    checked and decoded once, and the loops are per column, not per field of a rank."""
    recent = _decoded(rows, "recent", targets, records.resolve)
    if None in recent:
        targets = [t for t, calls in zip(targets, recent, strict=True) if calls is not None]
        recent = [calls for calls in recent if calls is not None]
        if not targets:
            return []
    index = [i for i, _ in targets]
    trackers = [tracker for _, tracker in targets]
    same, each = rows.same, rows.each
    for name, kinds in _COLUMN_KINDS:
        if name in same:
            value = same[name]
            if value is not None and type(value) not in kinds:
                value = None
            for tracker in trackers:
                tracker.__dict__[name] = value
            continue
        column = each.get(name)
        for i, tracker in zip(index, trackers, strict=True):
            value = None if column is None else column[i]
            if value is not None and type(value) not in kinds:
                value = None
            tracker.__dict__[name] = value
    means = _decoded(rows, "means", targets, _means)
    seqs = _decoded(rows, "seqs", targets, _seqs)
    loaders = _decoded(rows, "loaders", targets, _loaders)
    warnings = _decoded(rows, "warnings", targets, _warnings)
    opens = _decoded(rows, "opens", targets, records.opens)
    judged = _decoded(rows, "judged", targets, _judgement)
    reports = _decoded(rows, "reports", targets, _is_true)
    keys = records.keys
    for n, tracker in enumerate(trackers):
        # (a record made from rows is replaced, not changed, once its events are read again:
        # the values its node's ranks share are shared here too)
        tracker.events_seen = tracker.events_seen or 1
        tracker.version += 1
        if tracker.error_t is not None or tracker.exit_code is not None:
            # its node's launcher, which reads its file and sees its process, makes a row only
            # for a rank with neither: the lines were not the process's (own_lines.contradict)
            contradict(tracker, "its node's launcher found its process going on")
        tracker._means = means[n]
        tracker.group_seqs = seqs[n]
        tracker.loader_batches = loaders[n]
        tracker.warnings = warnings[n]
        calls = recent[n]
        if tracker.recent:
            tracker.recent.clear()
        tracker.recent_view = calls
        tracker.opens = opens[n]
        tracker.progress.adopt(judged[n], reports[n])
        if tracker.opens:
            tracker._calls_key = None
        else:  # the node's ranks share their latest calls, mostly: hashed once
            cached = keys.get(id(calls))
            if cached is None:
                tracker._calls_key = None
                cached = keys[id(calls)] = tracker.calls_key()
            tracker._calls_key = cached
    return trackers


def _decoded(rows: NodeRows, name: str, targets: list[tuple[int, RankTracker]], decode) -> Any:
    """Column `name` decoded for each target, in order: once when its ranks share it."""
    if name in rows.same:
        return [decode(rows.same[name])] * len(targets)
    column = rows.each.get(name)
    if column is None:
        return [decode(None)] * len(targets)
    return [decode(column[i]) for i, _ in targets]


def _is_true(value: Any) -> bool:
    return value is True


def _means(value: Any) -> tuple[float | None, float | None, float | None, int]:
    if type(value) is list and len(value) == 4:
        data, compute, comm, steps = value
        if type(steps) is int:
            return (
                data if type(data) in _NUMBER else None,
                compute if type(compute) in _NUMBER else None,
                comm if type(comm) in _NUMBER else None,
                steps,
            )
    return None, None, None, 0


def _seqs(value: Any) -> dict[str, int]:
    return dict(_pairs(value, str, int))


def _loaders(value: Any) -> dict[int, int]:
    return dict(_pairs(value, int, int))


def _warnings(value: Any) -> dict[str, str]:
    return dict(list(_pairs(value, str, str))[:MAX_WARNINGS])


def _pairs(value: Any, first: type, second: type) -> Iterable[tuple[Any, Any]]:
    for pair in value if isinstance(value, list) else ():
        if (
            type(pair) is list
            and len(pair) == 2
            and type(pair[0]) is first
            and type(pair[1]) is second
        ):
            yield pair[0], pair[1]


def _judgement(value: Any) -> Judgement | None:
    if type(value) is not list or len(value) != 7:
        return None
    state_name, since, cpu, where, frame, child, gpu = value
    state = ACTIVITY_STATES.get(state_name) if type(state_name) is str else None
    if state is None or type(since) not in _NUMBER:
        return None
    return Judgement(
        state,
        since,
        cpu if type(cpu) in _NUMBER else None,
        where if type(where) is str else None,
        frame if type(frame) is str else None,
        child if type(child) in _NUMBER else None,
        gpu if type(gpu) in _NUMBER else None,
    )
