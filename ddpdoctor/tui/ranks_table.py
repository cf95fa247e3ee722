"""The ranks table: one row per rank (or per host beyond GROUP_THRESHOLD ranks), updated in place.

Rows are keyed ("r3", "hnode-07") and every snapshot is diffed cell by cell against what is on
screen: only changed cells go through `update_cell`, rows come and go with add_row / remove_row, and
the order changes with one `sort` call when it must. The table is never cleared and rebuilt, except
when it switches between per-rank and per-host rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.widgets import DataTable

from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.tui.table_model import COLUMN_KEYS, COLUMNS, SORT_ORDERS, Cell, SortOrder
from ddpdoctor.tui.view_model import PreparedView, ViewSettings, build_table


class KeyedText(Text):
    """A cell that knows its row, so DataTable.sort can order rows by our own display order."""

    __slots__ = ("row_key",)

    def __init__(self, text: str, row_key: str, **kwargs) -> None:
        super().__init__(text, **kwargs)
        self.row_key = row_key


def _cell_text(cell: Cell, column_index: int, row_key: str | None = None) -> Text:
    text, style = cell
    column = COLUMNS[column_index]
    justify = column.justify
    if row_key is not None:
        return KeyedText(
            text, row_key, style=style, justify=justify, no_wrap=True, overflow="ellipsis"
        )
    return Text(text, style=style, justify=justify, no_wrap=True, overflow="ellipsis")


class RanksTable(DataTable):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Detail")]

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)

    def __init__(self, *, id: str | None = None) -> None:
        # The rank column stays put when an 80-column terminal scrolls the table sideways.
        super().__init__(id=id, cursor_type="row", fixed_columns=1)
        # Replaced, never mutated: the poll thread reads it to prepare the next rows.
        self.settings = ViewSettings()
        self.prepared: PreparedView | None = None  # rows built on the poll thread
        self.grouped = False
        self._shown: dict[str, tuple[Cell, ...]] = {}
        self._order: list[str] = []
        self._mode: bool | None = None  # grouped or not, as currently laid out

    @property
    def current_sort(self) -> SortOrder:
        return SORT_ORDERS[self.settings.sort_index]

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column.label, width=column.width, key=column.key)
        self._set_title()

    def cycle_sort(self) -> SortOrder:
        index = (self.settings.sort_index + 1) % len(SORT_ORDERS)
        self.settings = replace(self.settings, sort_index=index)
        self._set_title()
        self.show(self.snapshot)
        return self.current_sort

    def toggle_host(self, host: str) -> None:
        expanded = self.settings.expanded.symmetric_difference({host})
        self.settings = replace(self.settings, expanded=expanded)
        self.show(self.snapshot)

    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:  # noqa: BLE001 - an empty or shrinking table has no selection
            return None
        return row_key.value

    def watch_snapshot(self, snapshot: Snapshot | None) -> None:
        self.show(snapshot)

    def _set_title(self) -> None:
        self.border_title = f"ranks · sorted by {self.current_sort.title} (s)"

    def show(self, snapshot: Snapshot | None) -> None:
        if snapshot is None or not self.columns:
            return
        prepared = self.prepared
        if (
            prepared is not None
            and prepared.snapshot is snapshot
            and prepared.settings == self.settings
        ):
            model = prepared.table
        else:
            model = build_table(snapshot, self.settings)
        if self._mode is not None and model.grouped != self._mode:
            # Per-rank <-> per-host is a different table; the only full rebuild there is.
            self.clear()
            self._shown.clear()
            self._order.clear()
        self._mode = self.grouped = model.grouped
        cursor_key = self.selected_key()
        wanted = [row.key for row in model.rows]
        wanted_set = set(wanted)
        for gone in [key for key in self._order if key not in wanted_set]:
            self.remove_row(gone)
            del self._shown[gone]
        order = [key for key in self._order if key in wanted_set]
        for row in model.rows:
            old = self._shown.get(row.key)
            if old is None:
                self.add_row(
                    *(
                        _cell_text(cell, i, row.key if i == 0 else None)
                        for i, cell in enumerate(row.cells)
                    ),
                    key=row.key,
                )
                order.append(row.key)
            elif old != row.cells:
                for i, (before, after) in enumerate(zip(old, row.cells, strict=True)):
                    if before != after:
                        value = _cell_text(after, i, row.key if i == 0 else None)
                        self.update_cell(row.key, COLUMN_KEYS[i], value)
            self._shown[row.key] = row.cells
        if order != wanted:
            position = {key: index for index, key in enumerate(wanted)}
            self.sort(COLUMN_KEYS[0], key=lambda cell: position[cell.row_key])
        self._order = wanted
        # Rows added, removed or reordered: the selection stays on the same rank or host.
        if cursor_key in wanted_set and self.get_row_index(cursor_key) != self.cursor_row:
            self.move_cursor(row=self.get_row_index(cursor_key), animate=False)
