"""View models built on the poll thread, so that applying a snapshot on the event loop is cheap.

The table rows (with host aggregates) and the graph series of 1024 ranks take tens of
milliseconds to compute: the poll thread builds them right after polling, for the view settings
current at that moment (sort order, expanded hosts). The app uses them when those settings still
hold when the snapshot arrives, and recomputes on the event loop only when the user has just
changed them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.tui.graphs import GraphModel, build_graphs
from ddpdoctor.tui.table_model import SORT_ORDERS, TableModel, build_model


@dataclass(frozen=True)
class ViewSettings:
    sort_index: int = 0
    expanded: frozenset[str] = frozenset()  # hosts whose ranks are shown under their host row


@dataclass(frozen=True)
class PreparedView:
    snapshot: Snapshot
    settings: ViewSettings
    table: TableModel
    graphs: GraphModel


def build_table(snapshot: Snapshot, settings: ViewSettings) -> TableModel:
    return build_model(snapshot, sort=SORT_ORDERS[settings.sort_index], expanded=settings.expanded)


def prepare_view(snapshot: Snapshot, settings: ViewSettings) -> PreparedView:
    return PreparedView(
        snapshot=snapshot,
        settings=settings,
        table=build_table(snapshot, settings),
        graphs=build_graphs(snapshot),
    )
