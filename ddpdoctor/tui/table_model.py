"""What the ranks table shows, as plain data: rows in display order, each cell a (text, style) pair.

The widget (ranks_table.py) diffs these pairs against what it shows and updates only the cells that
changed. Keeping the model free of Textual makes the row logic (aggregation by host, sorting,
culprit highlighting) testable without an app, and cheap enough for 1024 ranks a few times a second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot
from ddpdoctor.protocol.verdicts import ActivityState
from ddpdoctor.tui import fmt

# Beyond this many ranks the table shows one row per host (Enter expands a host): 1024 rank rows
# are neither readable nor cheap to keep current, 128 host rows are both.
GROUP_THRESHOLD = 64

Cell = tuple[str, str]  # (text, rich style)


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    justify: Literal["left", "center", "right"] = "left"


# Ordered so that an 80-column terminal shows what matters in a hang: who, what state, how far,
# which collective and for how long.
COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank", 10),
    Column("state", "state", 14),
    Column("step", "step", 9, "right"),
    Column("progress", "progress", 10),
    Column("collective", "collective", 18),
    Column("wait", "wait", 6, "right"),
    Column("heartbeat", "hb age", 6, "right"),
    Column("step_time", "step t", 7, "right"),
    Column("samples", "smp/s", 7, "right"),
    Column("loss", "loss", 8, "right"),
    Column("epoch", "ep", 3, "right"),
    Column("host", "host", 12),
    Column("pid", "pid", 7, "right"),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
_RANK_WIDTH = next(c.width for c in COLUMNS if c.key == "rank")
_PROGRESS_WIDTH = next(c.width for c in COLUMNS if c.key == "progress")
_COLLECTIVE_WIDTH = next(c.width for c in COLUMNS if c.key == "collective")


@dataclass(frozen=True)
class SortOrder:
    """One entry of the sort cycle: which column, and the value a rank sorts by (smaller first)."""

    column: str
    title: str
    rank_key: Callable[[RankView], float]


def _waiting(rv: RankView) -> float:
    return rv.collective.waiting_s if rv.collective else 0.0


# Every order puts the interesting rows first: the worst state, the laggard, the longest wait.
SORT_ORDERS: tuple[SortOrder, ...] = (
    SortOrder("rank", "rank", lambda rv: float(rv.rank)),
    SortOrder("state", "worst state", lambda rv: -float(fmt.state_severity(rv.state))),
    SortOrder("step", "fewest steps", lambda rv: float(rv.step if rv.step is not None else -1)),
    SortOrder("wait", "longest wait", lambda rv: -_waiting(rv)),
    SortOrder("heartbeat", "oldest heartbeat", lambda rv: -(rv.heartbeat_age_s or 0.0)),
    SortOrder("step_time", "slowest step", lambda rv: -(rv.step_time_s or 0.0)),
    SortOrder("samples", "lowest samples/s", lambda rv: rv.samples_per_s or 0.0),
)


@dataclass(frozen=True)
class Row:
    key: str  # "r<rank>" or "h<host>": stable, so the widget can update it in place
    cells: tuple[Cell, ...]  # one per COLUMNS entry
    rank: int | None = None  # set on rank rows
    host: str | None = None  # set on host rows


@dataclass(frozen=True)
class TableModel:
    grouped: bool
    rows: tuple[Row, ...]  # display order


def rank_row_key(rank: int) -> str:
    return f"r{rank}"


def host_row_key(host: str) -> str:
    return f"h{host}"


def host_of(rv: RankView) -> str:
    return rv.host or "?"


def should_group(snapshot: Snapshot) -> bool:
    return len(snapshot.ranks) > GROUP_THRESHOLD


def build_model(
    snapshot: Snapshot,
    *,
    sort: SortOrder = SORT_ORDERS[0],
    expanded: Iterable[str] = (),
) -> TableModel:
    total = snapshot.run.total_steps
    culprits = snapshot.culprits
    busy = BusyWaits.of(snapshot)
    if not should_group(snapshot):
        ordered = sorted(snapshot.ranks, key=lambda rv: (sort.rank_key(rv), rv.rank))
        rows = tuple(rank_row(rv, total, rv.rank in culprits, busy) for rv in ordered)
        return TableModel(grouped=False, rows=rows)

    by_host: dict[str, list[RankView]] = {}
    for rv in snapshot.ranks:
        by_host.setdefault(host_of(rv), []).append(rv)
    open_hosts = set(expanded)
    keyed = sorted(
        by_host.items(),
        key=lambda item: (min(sort.rank_key(rv) for rv in item[1]), min(r.rank for r in item[1])),
    )
    rows_out: list[Row] = []
    for host, members in keyed:
        is_open = host in open_hosts
        rows_out.append(host_row(host, members, total, culprits, expanded=is_open))
        if is_open:
            members_sorted = sorted(members, key=lambda rv: (sort.rank_key(rv), rv.rank))
            rows_out.extend(rank_row(rv, total, rv.rank in culprits, busy) for rv in members_sorted)
    return TableModel(grouped=True, rows=tuple(rows_out))


def _tone(state: RankState) -> str:
    """A style for every cell of a rank in trouble, so its whole row stands out."""
    if state is RankState.FAILED:
        return "red"
    if state is RankState.GONE:
        return "magenta"
    if state is RankState.STALLED:
        return "dark_orange"
    return ""


def collective_text(rv: RankView) -> tuple[str, str]:
    """The collective a rank is in, or how it ended once it has."""
    if rv.collective is not None:
        text = f"{rv.collective.op} #{rv.collective.seq}"
        if rv.collective.group != "default":
            text += f" ({rv.collective.group})"
        return fmt.truncate(text, _COLLECTIVE_WIDTH), ""
    if rv.state.finished:
        if rv.error:
            return fmt.truncate(rv.error, _COLLECTIVE_WIDTH), "red"
        if rv.exit_code is not None:
            text = f"exit {rv.exit_code}"
            if rv.exit_signal:
                text += f" {rv.exit_signal}"
            return fmt.truncate(text, _COLLECTIVE_WIDTH), "dim" if rv.exit_code == 0 else "red"
        return "vanished", "magenta"
    return fmt.NONE, "dim"


@dataclass(frozen=True)
class BusyWaits:
    """Who waits for a busy rank (a wait, not a hang), and the busy ranks waited on."""

    waiting_for: dict[int, tuple[int, ...]]  # waiter -> the busy ranks it waits for
    waited_on: frozenset[int]

    @classmethod
    def of(cls, snapshot: Snapshot) -> BusyWaits:
        waiting_for: dict[int, tuple[int, ...]] = {}
        waited_on: set[int] = set()
        for wait in snapshot.waits:
            if wait.busy:
                waited_on.update(wait.on)
                waiting_for.update((w, wait.on) for w in wait.waiters)
        return cls(waiting_for, frozenset(waited_on))


NO_BUSY_WAITS = BusyWaits({}, frozenset())
_STATE_WIDTH = next(c.width for c in COLUMNS if c.key == "state")


def state_cell(rv: RankView, busy: BusyWaits) -> Cell:
    """The state column: "wait r0 (busy)" for a rank waiting for a busy one, "busy" for the rank
    it waits for, else the rank's state."""
    on = busy.waiting_for.get(rv.rank)
    if on and rv.state is RankState.WAITING:
        who = f"r{on[0]}" + (f"+{len(on) - 1}" if len(on) > 1 else "")
        return fmt.truncate(f"wait {who} (busy)", _STATE_WIDTH), "yellow"
    if rv.rank in busy.waited_on and not rv.state.finished and rv.activity is not None:
        gpu = rv.activity.state is ActivityState.GPU_WAIT
        return ("busy (GPU)" if gpu else "busy"), "bold cyan"
    return fmt.state_label(rv.state), fmt.state_style(rv.state)


def rank_row(
    rv: RankView, run_total: int | None, is_culprit: bool, busy: BusyWaits = NO_BUSY_WAITS
) -> Row:
    tone = _tone(rv.state)
    total = rv.total_steps or run_total
    wait_style = {
        RankState.WAITING: "yellow",
        RankState.STALLED: "bold dark_orange",
    }.get(rv.state, tone)
    coll_text, coll_style = collective_text(rv)
    rank_text = f"{fmt.CULPRIT_MARK} {rv.rank}" if is_culprit else f"  {rv.rank}"
    if rv.restarts:  # restarted by its launcher (torchrun --max-restarts, Ray Train retries)
        rank_text += f" ↻{rv.restarts}"
    cells: tuple[Cell, ...] = (
        (rank_text, fmt.CULPRIT_STYLE if is_culprit else tone or "bold"),
        state_cell(rv, busy),
        (fmt.steps(rv.step, total), tone),
        (fmt.progress_bar(rv.step, total, _PROGRESS_WIDTH), tone or "green"),
        (coll_text, coll_style or tone),
        (fmt.duration(rv.collective.waiting_s) if rv.collective else fmt.NONE, wait_style),
        (
            fmt.duration(rv.heartbeat_age_s),
            "bold dark_orange" if rv.state is RankState.STALLED else tone,
        ),
        (fmt.step_seconds(rv.step_time_s), tone),
        (fmt.rate(rv.samples_per_s), tone),
        (fmt.loss(rv.loss), tone),
        (str(rv.epoch) if rv.epoch is not None else fmt.NONE, tone),
        (fmt.truncate(host_of(rv), 12), tone),
        (str(rv.pid) if rv.pid is not None else fmt.NONE, tone),
    )
    return Row(key=rank_row_key(rv.rank), cells=cells, rank=rv.rank)


def _worst_state(members: Sequence[RankView]) -> tuple[RankState, int]:
    worst = max(members, key=lambda rv: fmt.state_severity(rv.state)).state
    return worst, sum(1 for rv in members if rv.state is worst)


def host_row(
    host: str,
    members: Sequence[RankView],
    run_total: int | None,
    culprits: frozenset[int],
    *,
    expanded: bool,
) -> Row:
    """One row summarising a host's ranks: the worst state, the laggard's step, the longest wait."""
    worst, count = _worst_state(members)
    state_text = fmt.state_label(worst)
    if count != len(members):
        state_text += f" {count}/{len(members)}"
    tone = _tone(worst)
    has_culprit = any(rv.rank in culprits for rv in members)
    arrow = "▾" if expanded else "▸"
    # Host rows name the host where rank rows name the rank; the pid column counts its ranks.
    rank_text = f"{arrow}{fmt.CULPRIT_MARK if has_culprit else ' '}{host}"
    steps_known = [rv.step for rv in members if rv.step is not None]
    laggard = min(steps_known) if steps_known else None
    totals: list[int | None] = [rv.total_steps for rv in members if rv.total_steps] or [run_total]
    total = totals[0]
    in_coll = [rv for rv in members if rv.collective is not None]
    longest = max(in_coll, key=_waiting) if in_coll else None
    if longest is not None and longest.collective is not None:
        coll = (fmt.truncate(f"{longest.collective.op} #{longest.collective.seq}", 18), tone)
        stuck = worst in (RankState.WAITING, RankState.STALLED)
        wait = (fmt.duration(longest.collective.waiting_s), "yellow" if stuck else tone)
    else:
        coll = (fmt.NONE, "dim")
        wait = (fmt.NONE, tone)
    ages = [rv.heartbeat_age_s for rv in members if rv.heartbeat_age_s is not None]
    times = [rv.step_time_s for rv in members if rv.step_time_s is not None]
    rates = [rv.samples_per_s for rv in members if rv.samples_per_s is not None]
    losses = [rv.loss for rv in members if rv.loss is not None]
    epochs = [rv.epoch for rv in members if rv.epoch is not None]
    cells: tuple[Cell, ...] = (
        (fmt.truncate(rank_text, _RANK_WIDTH), fmt.CULPRIT_STYLE if has_culprit else "bold"),
        (state_text, fmt.state_style(worst)),
        (fmt.steps(laggard, total), tone),
        (fmt.progress_bar(laggard, total, _PROGRESS_WIDTH), tone or "green"),
        coll,
        wait,
        (fmt.duration(max(ages)) if ages else fmt.NONE, tone),
        (fmt.step_seconds(max(times)) if times else fmt.NONE, tone),
        (fmt.rate(sum(rates)) if rates else fmt.NONE, tone),
        (fmt.loss(fmean(losses)) if losses else fmt.NONE, tone),
        (str(min(epochs)) if epochs else fmt.NONE, tone),
        (fmt.truncate(host, 12), "bold"),
        (f"×{len(members)}", "dim"),
    )
    return Row(key=host_row_key(host), cells=cells, host=host)
