"""torchft's replica groups as the monitor sees them: which group each rank is in, the quorums,
the heals, and how a replica's earlier processes ended.

A torchft job outlives the death of a replica group: the other groups train on, the group's own
torchrun starts it again, and the new process heals (loads the state of a peer group) at the next
quorum. A replica's restart is an attempt of its ranks like any launcher's restart: how the old
process ended is decided once, by the attempts model (ddpdoctor.monitor.model.attempts, which
sees every hello first, RunState.apply), and `ReplicaLog` adds to it the replica group, the
quorums and the heals, from the ranks' own events (ddpdoctor.protocol.replica_groups). The signal
of a process that wrote no exit event is looked up in torchrun's log by its pid when the
snapshot is made (the group's torchrun may write it after the new process said hello).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpdoctor.monitor.model.attempt_views import RankEnding
from ddpdoctor.protocol.replica_groups import HEALED, QUORUM

MAX_ENDINGS = 256  # replica processes remembered (a job restarting in a loop is said in part)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ReplicaEnding:
    """How one earlier process of a torchft rank ended (a new process of the rank followed)."""

    rank: int
    group: int | None  # its replica group
    pid: int | None
    t: float | None  # its last event
    step: int | None
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    line: str | None = None  # the user's line it raised at

    @classmethod
    def of(cls, ending: RankEnding, group: int | None) -> ReplicaEnding:
        """The attempts model's ending of a process of a rank in replica group `group`."""
        return cls(
            rank=ending.rank,
            group=group,
            pid=ending.pid,
            t=ending.t,
            step=ending.step,
            exit_code=ending.exit_code,
            signal=ending.signal,
            error=ending.cause if ending.raised else None,
            line=ending.line,
        )

    @property
    def cause(self) -> str:
        if self.error:
            return self.error + (f" at {self.line}" if self.line else "")
        if self.signal:
            return f"killed by {self.signal}"
        if self.exit_code is not None and self.exit_code != 0:
            return f"exit code {self.exit_code}"
        if self.exit_code == 0:
            return "it exited"
        return "its process ended without an exit event"

    @property
    def failed(self) -> bool:
        return self.exit_code != 0 or bool(self.error or self.signal)


@dataclass(frozen=True)
class Heal:
    rank: int
    t: float | None
    from_group: int | None
    step: int | None  # the step it resumed at
    done: bool  # the peer's state is loaded (`healed`), not only asked for


@dataclass(frozen=True)
class TorchftView:
    """The torchft facts of a run, for the judge (ddpdoctor.monitor.judge.rules.torchft)."""

    groups: tuple[tuple[int, int], ...]  # (rank, replica group)
    endings: tuple[ReplicaEnding, ...]
    heals: tuple[Heal, ...]
    quorum_id: int | None  # the latest quorum a rank reported
    quorum_groups: tuple[int, ...]  # ... and the replica groups in it

    def group_of(self, rank: int) -> int | None:
        return next((g for r, g in self.groups if r == rank), None)

    def heal_after(self, rank: int, t: float | None) -> Heal | None:
        """The rank's first heal after `t` (its new process's), done ones first."""
        later = [h for h in self.heals if h.rank == rank and (t is None or (h.t or 0) >= t)]
        return next((h for h in later if h.done), later[0] if later else None)


class ReplicaLog:
    def __init__(self) -> None:
        self.groups: dict[int, int] = {}
        self.endings: list[ReplicaEnding] = []
        self.heals: list[Heal] = []
        self.quorum: tuple[float, int, tuple[int, ...]] | None = None  # (t, id, groups)
        self._asked: dict[int, int | None] = {}  # rank -> the group its pending heal is from

    @property
    def active(self) -> bool:
        return bool(self.groups)

    def on_hello(self, event: dict[str, Any], ending: RankEnding | None) -> None:
        """A rank's hello; `ending`: how the rank's previous process ended when the hello is of
        a new process (the attempts model's, ddpdoctor.monitor.model.attempts), else None."""
        rank = event["rank"]
        facts = event.get("torchft")
        if isinstance(facts, dict) and _int(facts.get("replica_group")) is not None:
            self.groups[rank] = facts["replica_group"]
        if ending is None or rank not in self.groups or len(self.endings) >= MAX_ENDINGS:
            return
        self.endings.append(ReplicaEnding.of(ending, self.groups.get(rank)))

    def on_event(self, event: dict[str, Any], t: float | None) -> None:
        """A `torchft` event of a rank."""
        rank, what = event["rank"], event.get("what")
        if what == QUORUM:
            quorum_id = _int(event.get("quorum_id"))
            groups = event.get("replica_groups")
            if quorum_id is not None and isinstance(groups, list):
                members = tuple(g for g in groups[:4096] if _int(g) is not None)
                if self.quorum is None or quorum_id >= self.quorum[1]:
                    self.quorum = (t or 0.0, quorum_id, members)
            if "heal_from" in event:
                source = _int(event.get("heal_from_group"))
                self._asked[rank] = source
                self._add_heal(Heal(rank, t, source, _int(event.get("max_step")), False))
        elif what == HEALED:
            source = self._asked.pop(rank, None)
            self._add_heal(Heal(rank, t, source, _int(event.get("step")), True))

    def _add_heal(self, heal: Heal) -> None:
        if len(self.heals) < MAX_ENDINGS:
            self.heals.append(heal)

    def view(self, signal_of: Any = None) -> TorchftView | None:
        """`signal_of(pid)`: (exit code, signal) torchrun's log gives a process, or None."""
        if not self.active:
            return None
        endings = []
        for ending in self.endings:
            if ending.signal is None and signal_of is not None and ending.pid is not None:
                found = signal_of(ending.pid)
                if found is not None:
                    code, sig = found
                    ending = ReplicaEnding(
                        ending.rank, ending.group, ending.pid, ending.t, ending.step,
                        ending.exit_code if ending.exit_code is not None else code, sig,
                        ending.error, ending.line,
                    )  # fmt: skip
            endings.append(ending)
        quorum = self.quorum
        return TorchftView(
            groups=tuple(sorted(self.groups.items())),
            endings=tuple(endings),
            heals=tuple(self.heals),
            quorum_id=quorum[1] if quorum else None,
            quorum_groups=quorum[2] if quorum else (),
        )
