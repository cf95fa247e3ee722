"""The monitor's network side: a launcher's looks at its own ranks' connections once they all
stall (ddpdoctor.monitor.follow.net_watch), and every node's looks read back for the judge."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.net_watch import NetReports, NetWatch, is_loopback, job_names
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
        self.forged: dict[int, str] = {}  # node -> why its network.json was not taken

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
            self._latest = self._checked(self.reports.read(nodes))
        if vouched is None:
            return self._latest
        return tuple(replace(look, vouched=vouched(look)) for look in self._latest)

    def own(self, look: NodeNetwork) -> bool:
        """Whether `look` is the one this launcher took itself (held in memory)."""
        return (
            self.watch is not None
            and self.watch.latest is not None
            and (look.to_json() == self.watch.latest.to_json())
        )

    def _checked(self, looks: tuple[NodeNetwork, ...]) -> tuple[NodeNetwork, ...]:
        """The looks read from the nodes' files, checked against what this process knows:
        its own node's look is the one it took (the file is not read back for it), and a look
        that contradicts itself (a link to its own host, a node number not its file's) is none
        a launcher wrote."""
        own_node = self.watch.node_rank if self.watch is not None else None
        kept = []
        for look in looks:
            why = None
            if look.node_rank == own_node:
                if not self.own(look):
                    why = "this node's launcher did not write it"
            else:
                why = self_contradiction(look)
            if why is None:
                kept.append(look)
            else:
                self.forged[look.node_rank] = why
        latest = self.watch.latest if self.watch is not None else None
        if latest is not None and not any(look.node_rank == own_node for look in kept):
            kept.append(latest)
        return tuple(kept)

    def findings(self, snap: Snapshot) -> list[Finding]:
        found = self.startup.findings(no_rank_started(snap)) if self.startup is not None else []
        if self.forged:
            said = "; ".join(
                f"nodes/node-{node}/network.json: {why}"
                for node, why in sorted(self.forged.items())[:4]
            )
            found.append(
                Finding(
                    "network.unvouched",
                    Severity.WARNING,
                    f"a network look not taken by ddpdoctor was not read ({said})",
                    "A node's network.json is written by its own launcher only. One written by "
                    "anything else (a process of the job, a copy from another run) is reported, "
                    "never acted on.",
                )
            )
        return found

    def wait(self, timeout_s: float) -> None:
        if self.watch is not None:
            self.watch.wait(timeout_s)


def self_contradiction(look: NodeNetwork) -> str | None:
    """Why a look is none a launcher took (its links leave its own host, by construction)."""
    for link in look.links:
        if look.owns(link.peer) or is_loopback(link.peer):
            return f"it names a link from {look.host} to its own address {link.peer}"
    return None


def no_rank_started(snap: Snapshot) -> bool:
    return all(v.state is RankState.STARTING for v in snap.ranks)


def _hosts(snap: Snapshot) -> set[str]:
    return {v.host for v in snap.ranks if v.host}
