"""Builders of snapshots and event streams for the monitor's and the rules' unit tests.

Rules are pure functions of a Snapshot, so their tests build snapshots by hand: `view()` is a
RankView with sensible defaults for a healthy rank in training, `coll()` a collective, `snap()`
a Snapshot with thresholds. `Stream` writes event dicts the way the runtime does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddpdoctor.monitor.judge.diagnose import CHECK_INDEX
from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    StackGroup,
    Thresholds,
)

NOW = 1_000_000.0


def coll(op: str = "all_reduce", seq: int = 1, waiting_s: float = 0.0, **kw: Any) -> CollectiveView:
    kw.setdefault("since_t", NOW - waiting_s)
    kw.setdefault("shapes", ((10,),) if op == "all_reduce" else ())
    kw.setdefault("dtypes", ("float32",) if op == "all_reduce" else ())
    return CollectiveView(op, seq, waiting_s, **kw)


def view(rank: int, state: RankState = RankState.RUNNING, **kw: Any) -> RankView:
    """A rank in training, heartbeat fresh, at the collective sequence number `seq` (default 40)."""
    seq = kw.pop("seq", 40)
    kw.setdefault("host", "node0")
    kw.setdefault("pid", 1000 + rank)
    kw.setdefault("phase", "train")
    kw.setdefault("step", 10)
    kw.setdefault("heartbeat_age_s", 0.5)
    kw.setdefault("last_heartbeat_t", NOW - kw["heartbeat_age_s"])
    kw.setdefault("last_event_t", NOW - 0.2)
    kw.setdefault("last_progress_t", NOW - 0.2)
    kw.setdefault("alive", True)
    current = kw.get("collective")
    if "group_seqs" not in kw:
        top = max(seq, current.seq if current is not None else 0)
        kw["group_seqs"] = (("default", top),) if top else ()
    if "recent_collectives" not in kw:
        recent = [coll("all_reduce", s, 0.01, done=True) for s in range(max(1, seq - 3), seq + 1)]
        if current is not None and current not in recent:
            recent = [c for c in recent if c.seq != current.seq] + [current]
        kw["recent_collectives"] = tuple(recent)
    return RankView(rank=rank, state=state, **kw)


def waiting(rank: int, seq: int, waited: float, op: str = "all_reduce", **kw: Any) -> RankView:
    """A rank waiting in collective #seq for `waited` seconds, heartbeat alive."""
    return view(rank, RankState.WAITING, collective=coll(op, seq, waited), seq=seq - 1, **kw)


def thresholds(hang_after: float = 5.0) -> Thresholds:
    return Thresholds(
        hang_after_s=hang_after, waiting_after_s=1.0, heartbeat_stale_s=3.0, basis="test"
    )


def snap(
    ranks: list[RankView],
    *,
    hang_after: float = 5.0,
    stacks: tuple[StackGroup, ...] = (),
    now: float = NOW,
    **kw: Any,
) -> Snapshot:
    built = Snapshot(
        run=RunInfo(name="test", run_dir="/tmp/test", world_size=len(ranks)),
        taken_t=now,
        ranks=tuple(ranks),
        stacks=stacks,
        thresholds=thresholds(hang_after),
        **kw,
    )
    if os.environ.get(CHECK_INDEX):
        # every snapshot of the rules' tests: the rules say the same with the rank index and
        # walking every rank
        from tests.unit.monitor.index_check import same_both_ways

        same_both_ways(built)
    return built


class Stream:
    """Event dicts of one run, per rank, with times relative to `t0`."""

    def __init__(self, t0: float = NOW, world: int = 2) -> None:
        self.t0 = t0
        self.world = world
        self.events: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world)}
        self.seq: dict[int, int] = dict.fromkeys(range(world), 0)

    def ev(self, rank: int, t: float, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"v": 1, "t": self.t0 + t, "mono": t, "rank": rank, "kind": kind, **fields}
        self.events[rank].append(event)
        return event

    def hello(self, t: float = 0.0, host: str = "node0") -> None:
        for r in range(self.world):
            self.ev(r, t, "hello", local_rank=r, world_size=self.world, host=host, pid=4000 + r)
            self.ev(r, t + 0.01, "phase", phase="train")

    def collective(
        self, rank: int, t: float, op: str = "all_reduce", dur: float | None = 0.01, **kw: Any
    ) -> int:
        self.seq[rank] += 1
        seq = self.seq[rank]
        kw.setdefault("shapes", [[10]])
        kw.setdefault("dtypes", ["float32"])
        self.ev(rank, t, "collective_start", op=op, seq=seq, group="default", **kw)
        if dur is not None:
            self.ev(
                rank,
                t + dur,
                "collective_end",
                op=op,
                seq=seq,
                group="default",
                duration_s=dur,
                ok=True,
            )
        return seq

    def steps(self, n: int, *, t: float = 1.0, step_s: float = 0.1, ranks=None) -> float:
        """n healthy training steps on `ranks` (all), each with one all_reduce; returns the end t."""
        ranks = list(range(self.world)) if ranks is None else ranks
        for _i in range(n):
            for r in ranks:
                self.collective(r, t, dur=0.01)
                step = sum(1 for e in self.events[r] if e["kind"] == "step") + 1
                self.ev(
                    r,
                    t + step_s,
                    "step",
                    step=step,
                    step_time_s=step_s,
                    data_time_s=0.01,
                    compute_time_s=step_s - 0.02,
                    comm_wait_s=0.01,
                )
            t += step_s
        return t

    def heartbeats(
        self, rank: int, t_from: float, t_to: float, every: float = 1.0, **fields
    ) -> None:
        t = t_from
        while t <= t_to:
            self.ev(rank, t, "heartbeat", **fields)
            t += every

    def write(self, run_dir: Path) -> Path:
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps({"world_size": self.world, "backend": "gloo"}))
        for rank, events in self.events.items():
            ordered = sorted(events, key=lambda e: e["t"])
            lines = "".join(json.dumps(e) + "\n" for e in ordered)
            (run_dir / "events" / f"rank-{rank}.jsonl").write_text(lines)
        return run_dir


def test_view_defaults_describe_a_healthy_training_rank():
    v = view(0)
    assert v.state is RankState.RUNNING and v.seq_in("default") == 40 and v.alive


def test_waiting_rank_is_one_ahead_of_its_last_finished_collective():
    v = waiting(0, 41, 8.0)
    assert v.collective.seq == 41 and v.seq_in("default") == 41 and v.collective.waiting_s == 8.0
