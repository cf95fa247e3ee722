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

A watcher copies a row onto the rank's tracker (row_reader.apply_rows, a node's rows column by column): no
event is parsed or replayed, and the ranks of a node share the table's call records. A rank whose node stops calling it
routine goes back to its events (its node's whole digest of it), and the final word of a run
always rests on every rank's own event file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.monitor.model.event_fields import integer, num, text
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CollectiveView
from ddpdoctor.protocol.verdicts import ActivityState

# The tracker's plain fields a row carries, in this order, each with the check its value must
# pass on the way in (a row is read from the shared run directory: never trusted blindly).
ROW_FIELDS: tuple[tuple[str, Any], ...] = (
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
_NAMES = tuple(name for name, _ in ROW_FIELDS)
# After the scalars: means, group seqs, loader batches, warnings, recent calls, open calls,
# activity, whether its heartbeats carry progress facts.
MAX_WARNINGS = 16
ACTIVITY_STATES = {state.value: state for state in ActivityState}

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
    for tracker in trackers:  # (calls as their processes bore them out: call_events.bear)
        for call in tracker.borne_calls():
            table.add(call)
        for key, call in tracker.opens.items():
            if key not in tracker.unborne:
                table.add(call)
    return table


def encode_row(tracker: RankTracker, table: CallTable) -> list[Any] | None:
    """The rank's row, or None where its events must go instead (it is not routine, or one of
    its calls differs from another rank's of its node at that sequence number)."""
    if not routine(tracker):
        return None
    index, conflicting = table.index, table.conflicting
    recent = []
    for call in tracker.borne_calls():
        key = (call.group, call.seq)
        if key in conflicting:
            return None
        recent.append(index[key])
    opens = []
    for call in tracker.opens.values():
        key = (call.group, call.seq)
        if key in tracker.unborne:
            continue
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
