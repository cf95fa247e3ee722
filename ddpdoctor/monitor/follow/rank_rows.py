"""Rank rows: a routine rank's state in a node summary, in place of its events.

A launcher of a job over many nodes publishes, once a second, what the other watchers need to
know about its own ranks (ddpdoctor.monitor.follow.node_summaries). Replaying each rank's latest events
costs a watcher of 1000s of ranks a few events per rank per second to parse and fold in, and more
the faster the job steps. So for a rank whose node judges it routine (running, no error, fault,
exit or failed collective, its calls the same as its node's other ranks' at each sequence
number) the node publishes a row instead: the fields its tracker (RankTracker) folded from the
events, as the view reads them, plus

- its calls as indices into the node's call table: each distinct call of the node's ranks (op,
  group, sequence number, shapes, dtypes, members, call site) once, not once per rank;
- its activity as its own node judged it from its heartbeats' progress facts, children's CPU
  and GPU included.

A watcher copies a row onto the rank's tracker (`apply_rows`, a node's rows column by column): no
event is parsed or replayed, and the ranks of a node share the table's call records. A rank whose node stops calling it
routine goes back to its events (its node's whole digest of it), and the final word of a run
always rests on every rank's own event file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.monitor.model.progress import Judgement
from ddpdoctor.monitor.model.rank_tracker import RECENT_COLLECTIVES, RankTracker, integer, num, text
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CallSite, CollectiveView
from ddpdoctor.protocol.verdicts import ActivityState

# The tracker's plain fields a row carries, in this order, each with the check its value must
# pass on the way in (a row is read from the shared run directory: never trusted blindly).
_SCALARS: tuple[tuple[str, Any], ...] = (
    ("pid", integer),
    ("phase", text),
    ("step", integer),
    ("epoch", integer),
    ("loss", num),
    ("step_time_s", num),
    ("data_time_s", num),
    ("compute_time_s", num),
    ("comm_wait_s", num),
    ("samples_per_s", num),
    ("collectives_done", integer),
    ("last_event_t", num),
    ("last_progress_t", num),
    ("last_heartbeat_t", num),
    ("heartbeat_period", num),
    ("last_event", text),
    ("rss_bytes", integer),
    ("gpu_mem_bytes", integer),
    ("epoch_batches", integer),
)
_NAMES = tuple(name for name, _ in _SCALARS)
# After the scalars: means, group seqs, loader batches, warnings, recent calls, open calls,
# activity, whether its heartbeats carry progress facts.
MAX_WARNINGS = 16
_STATES = {state.value: state for state in ActivityState}

CallKey = tuple[str, int]


# Durations rounded to the microsecond, times to a tenth of a millisecond, rates to a tenth, on
# the way out: 17 digits each was most of a row, and a reader parses numbers of up to 15 digits
# several times faster (per rank per second, at 1000s of ranks).
TIME_DIGITS = 4
_ROUNDED = tuple(
    (_NAMES.index(name), digits)
    for name, digits in (
        ("last_event_t", TIME_DIGITS),
        ("last_progress_t", TIME_DIGITS),
        ("last_heartbeat_t", TIME_DIGITS),
        ("step_time_s", 6),
        ("data_time_s", 6),
        ("compute_time_s", 6),
        ("comm_wait_s", 6),
        ("heartbeat_period", 6),
        ("samples_per_s", 1),
    )
)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# -- the publishing node --------------------------------------------------------------------


class CallTable:
    """The distinct calls of one node's ranks, by (group, seq), for one summary."""

    def __init__(self) -> None:
        self.index: dict[CallKey, int] = {}
        self.calls: list[CollectiveView] = []
        self.conflicting: set[CallKey] = set()

    def add(self, call: CollectiveView) -> None:
        key = (call.group, call.seq)
        found = self.index.get(key)
        if found is None:
            self.index[key] = len(self.calls)
            self.calls.append(call)
        elif not _same_call(self.calls[found], call):
            self.conflicting.add(key)

    def encode(self) -> list[list[Any]]:
        return [_call_row(call) for call in self.calls]


def _same_call(a: CollectiveView, b: CollectiveView) -> bool:
    if a is b:
        return True
    return (a.op, a.shapes, a.dtypes, a.group_ranks, a.site) == (
        b.op,
        b.shapes,
        b.dtypes,
        b.group_ranks,
        b.site,
    )


def _call_row(call: CollectiveView) -> list[Any]:
    """[op, group, seq, since_t, waited, what]: `what`, the call's shapes, dtypes, members and
    site, as one JSON text, the same for every call made with the same tensors at the same line
    (a reader decodes each distinct one once)."""
    site = call.site
    what = [
        [list(shape) for shape in call.shapes],
        list(call.dtypes),
        None if call.group_ranks is None else list(call.group_ranks),
        None
        if site is None
        else [site.user, site.via, site.issuer, site.file, site.line, site.deferred],
    ]
    text = json.dumps(what, separators=(",", ":"), ensure_ascii=False)
    since = _round(call.since_t, TIME_DIGITS)
    return [call.op, call.group, call.seq, since, round(call.waiting_s, 6), text]


def routine(tracker: RankTracker) -> bool:
    """Whether a rank's row says all a watcher needs of it: it runs, and nothing about it is
    rare enough to need its events (an error, a fault, an exit, a failed collective, a
    point-to-point call, an activity the row cannot carry)."""
    return (
        tracker.pid is not None
        and tracker.events_seen > 0
        and tracker.error is None
        and tracker.error_t is None
        and tracker.exit_code is None
        and tracker.fault is None
        and tracker.failed_collective is None
        and tracker.traceback is None
        and all(call.op not in POINT_TO_POINT_OPS for call in tracker.opens.values())
    )


def table_of(trackers: Iterable[RankTracker]) -> CallTable:
    table = CallTable()
    for tracker in trackers:
        for call in tracker.latest_calls():
            table.add(call)
        for call in tracker.opens.values():
            table.add(call)
    return table


def encode_row(tracker: RankTracker, table: CallTable) -> list[Any] | None:
    """The rank's row, or None where its events must go instead (it is not routine, or one of
    its calls differs from another rank's of its node at that sequence number)."""
    if not routine(tracker):
        return None
    index, conflicting = table.index, table.conflicting
    recent = []
    for call in tracker.latest_calls():
        key = (call.group, call.seq)
        if key in conflicting:
            return None
        recent.append(index[key])
    opens = []
    for call in tracker.opens.values():
        key = (call.group, call.seq)
        if key in conflicting:
            return None
        opens.append([index[key], _round(call.since_t, TIME_DIGITS)])
    row: list[Any] = [getattr(tracker, name) for name in _NAMES]
    for i, digits in _ROUNDED:
        if row[i] is not None:
            row[i] = round(row[i], digits)
    judged = tracker.progress.judge()
    data, compute, comm, steps = tracker.own_work_means()
    row += [
        [_round(data, 6), _round(compute, 6), _round(comm, 6), steps],
        [[group, seq] for group, seq in tracker.group_seqs.items()],
        [[loader, n] for loader, n in tracker.loader_batches.items()],
        [[code, message] for code, message in tracker.warnings.items()],
        recent,
        opens,
        None
        if judged is None
        else [
            judged.state.value,
            round(judged.since_t, TIME_DIGITS),
            _round(judged.cpu_pct, 1),
            judged.where,
            judged.frame,
            _round(judged.child_cpu_pct, 1),
            _round(judged.gpu_util_pct, 1),
        ],
        tracker.progress.reports,
    ]
    return row


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


# -- a node's rows, column by column ---------------------------------------------------------

# The columns of a node's rows: its ranks' plain fields, then the structured ones.
COLUMNS = (*_NAMES, "means", "seqs", "loaders", "warnings", "recent", "opens", "judged", "reports")


def encode_rows(entries: list[tuple[int, int, int, list[Any]]]) -> dict[str, Any]:
    """A node's routine ranks' rows, (rank, last line, previous last line, row) each, as
    columns: a column all of whose ranks have one value holds it once ("same"), the others a
    value per rank ("each"). The ranks of a node mostly share their step, phase, calls and
    timings, so a reader parses and checks those once per node, not once per rank."""
    same: dict[str, Any] = {}
    each: dict[str, list[Any]] = {}
    for i, name in enumerate(COLUMNS):
        values = [entry[3][i] for entry in entries]
        first = values[0]
        if all(value == first for value in values):
            same[name] = first
        else:
            each[name] = values
    return {
        "rank": [entry[0] for entry in entries],
        "last": [entry[1] for entry in entries],
        "after": [entry[2] for entry in entries],
        "same": same,
        "each": each,
    }


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
_COLUMN_KINDS = tuple((name, _KINDS[check]) for name, check in _SCALARS if name != "pid")

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
    state = _STATES.get(state_name) if type(state_name) is str else None
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


def rows_of(
    trackers: Mapping[int, RankTracker], ranks: Iterable[int]
) -> tuple[CallTable, dict[int, list[Any]]]:
    """The call table of a node's ranks and the row of each routine one."""
    own = [trackers[r] for r in ranks if r in trackers]
    table = table_of(own)
    rows = {}
    for tracker in own:
        row = encode_row(tracker, table)
        if row is not None:
            rows[tracker.rank] = row
    return table, rows
