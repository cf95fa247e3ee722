"""The monitor's network side: a launcher's looks at its own ranks' connections once they all
stall (ddpdoctor.monitor.follow.net_watch), and every node's looks read back for the judge."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.follow.net_watch import NetReports, NetWatch, job_names
from ddpdoctor.monitor.follow.startup_names import StartupNames
from ddpdoctor.monitor.judge.rules.network import symmetric_stall
from ddpdoctor.monitor.model.network import NodeNetwork
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot
from ddpdoctor.protocol.rundir import RunDir

# While no stall asks for them, the nodes' files are read this often (a changed name).
READ_EVERY_S = 10.0


class NetworkFollow:
    """`look`: this process is the launcher of node `node_rank` of a job over several nodes,
    and looks at its own ranks' network when they stall; every monitor reads the looks."""

    def __init__(
        self, run: RunDir, node_rank: int | None, run_json: Mapping[str, Any], *, look: bool
    ) -> None:
        names = job_names(run_json, os.environ) if look else []
        self.watch = NetWatch(run, node_rank, names) if look and node_rank is not None else None
        # a launch where no rank starts: the names it needs (any launcher, one node or several)
        self.startup = StartupNames(names) if look else None
        self.reports = NetReports(run)
        self._read_t: float | None = None
        self._latest: tuple[NodeNetwork, ...] = ()

    def observe(self, snap: Snapshot | None, own: Mapping[int, int], now: float) -> None:
        """After a poll: a look when this node's ranks all stalled (never waits for it)."""
        if self.startup is not None and snap is not None:
            if no_rank_started(snap):
                self.startup.observe(True, snap.elapsed_s)
            else:
                self.startup = None  # a rank started: the names got it there, no more to say
        if self.watch is None or snap is None or snap.thresholds is None:
            return
        own_views = [v for v in snap.ranks if v.rank in own]
        self.watch.observe(own_views, own, now, snap.thresholds.hang_after_s, lambda: _hosts(snap))

    def read(
        self,
        snap: Snapshot,
        nodes: Iterable[int],
        now: float,
        vouched: Callable[[NodeNetwork], bool] | None = None,
    ) -> tuple[NodeNetwork, ...]:
        """The nodes' latest looks: at every poll while every rank stalls, else every
        READ_EVERY_S. `vouched`: a live watcher's judgement of the node behind each look (a
        look it does not vouch for explains a hang and never confirms a stop)."""
        due = self._read_t is None or not 0 <= now - self._read_t < READ_EVERY_S
        if symmetric_stall(snap) is not None or due:
            self._read_t = now
            self._latest = self.reports.read(nodes)
        if vouched is None:
            return self._latest
        return tuple(replace(look, vouched=vouched(look)) for look in self._latest)

    def findings(self, snap: Snapshot) -> list[Finding]:
        return self.startup.findings(no_rank_started(snap)) if self.startup is not None else []

    def wait(self, timeout_s: float) -> None:
        if self.watch is not None:
            self.watch.wait(timeout_s)


def no_rank_started(snap: Snapshot) -> bool:
    return all(v.state is RankState.STARTING for v in snap.ranks)


def _hosts(snap: Snapshot) -> set[str]:
    return {v.host for v in snap.ranks if v.host}
