"""Can the live TUI keep up with a big job? 1024 simulated ranks at 5 events per second each.

A synthetic source advances 1024 RankViews realistically on every poll (steps, collectives,
heartbeats, step-time histories, a straggler, log lines), as the monitor would for a live job.
The real app runs headless under Textual's test harness (`app.run_test(size=...)`) with its normal
timer, poll thread and widgets, and we measure:

    refreshes per second   snapshots applied AND painted per second   target >= 2
    apply time             handling one snapshot message (median, p95) target median < 100 ms
    paint time             the compositor's repaint after it (median, p95)

    python benchmarks/tui.py [--seconds S] [--ranks N] [--per-host K] [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    LogLine,
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    Verdict,
)
from ddpdoctor.tui.app import DdpDoctorApp

EVENTS_PER_STEP = 5  # collective_start, collective_end, step, heartbeat, one more bucket
TARGET_REFRESH_PER_S = 2.0
TARGET_APPLY_MEDIAN_S = 0.100


@dataclass
class SimRank:
    rank: int
    speed: float  # steps per second: 1.0 at 5 events per step and second, a little noise
    progress: float = 0.0
    history: list[float] = field(default_factory=list)


class SyntheticRun:
    """A SnapshotSource whose ranks each produce `events_per_s` events per second."""

    def __init__(self, world: int, per_host: int, events_per_s: float, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.world, self.per_host = world, per_host
        self.steps_per_s = events_per_s / EVENTS_PER_STEP
        self.ranks = [SimRank(r, self.steps_per_s * rng.uniform(0.97, 1.03)) for r in range(world)]
        # One straggler: all of its step is its own work, where the others mostly wait for it.
        self.straggler = world // 3
        self.started = time.time()
        self.last = self.started
        self.logs: list[LogLine] = []
        self.events_f = 0.0
        self.polls = 0
        self.poll_times: list[float] = []
        hosts = tuple(f"node-{h:03d}" for h in range((world + per_host - 1) // per_host))
        self.info = RunInfo(
            name="synthetic-1024",
            run_dir="/nonexistent",
            world_size=world,
            backend="nccl",
            hosts=hosts,
            started_t=self.started,
            total_steps=100_000,
        )

    def request_stacks(self) -> None:
        return None

    def poll(self) -> Snapshot:
        begin = time.perf_counter()
        now = time.time()
        dt, self.last = now - self.last, now
        slowest = min(r.progress + r.speed * dt for r in self.ranks)
        views = []
        for sim in self.ranks:
            before = sim.progress
            # Synchronous DDP: nobody gets more than a step ahead of the slowest rank.
            sim.progress = min(sim.progress + sim.speed * dt, slowest + 1.0)
            done = int(sim.progress)
            for _ in range(done - int(before)):
                sim.history.append(round(1.0 / self.steps_per_s * random.uniform(0.95, 1.05), 4))
            del sim.history[:-60]
            self.events_f += (sim.progress - before) * EVENTS_PER_STEP
            views.append(self._view(sim, now, done))
        self.polls += 1
        if self.polls % 2 == 0:
            rank = random.randrange(self.world)
            self.logs.append(LogLine(f"rank {rank} stdout", f"step {views[rank].step}", rank=rank))
            del self.logs[:-200]
        snapshot = Snapshot(
            run=self.info,
            taken_t=now,
            ranks=tuple(views),
            verdict=Verdict.RUNNING,
            logs=tuple(self.logs),
        )
        self.poll_times.append(time.perf_counter() - begin)
        return snapshot

    def _view(self, sim: SimRank, now: float, done: int) -> RankView:
        phase = sim.progress - done
        straggler = sim.rank == self.straggler
        in_coll = phase > 0.6 and not straggler
        step_time = 1.0 / self.steps_per_s
        return RankView(
            rank=sim.rank,
            state=RankState.IN_COLLECTIVE if in_coll else RankState.RUNNING,
            host=f"node-{sim.rank // self.per_host:03d}",
            pid=10_000 + sim.rank,
            local_rank=sim.rank % self.per_host,
            step=done,
            total_steps=100_000,
            epoch=done // 1000,
            loss=2.0 / (1 + done / 50),
            step_time_s=step_time,
            data_time_s=0.3 * step_time if straggler else 0.05 * step_time,
            compute_time_s=0.6 * step_time if straggler else 0.3 * step_time,
            comm_wait_s=0.1 * step_time if straggler else 0.65 * step_time,
            samples_per_s=64 / step_time,
            collective=CollectiveView("all_reduce", done * 3 + 1, phase * step_time)
            if in_coll
            else None,
            heartbeat_age_s=(now * 7 + sim.rank) % 1.0,
            alive=True,
            step_times=tuple(sim.history),
        )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(world: int, per_host: int, seconds: float, size: tuple[int, int]) -> dict:
    source = SyntheticRun(world, per_host, events_per_s=5.0)
    app = DdpDoctorApp(source, mode="watch")
    paints: list[tuple[float, float]] = []  # (when, how long)
    async with app.run_test(size=size) as pilot:
        while app.applied == 0:
            await pilot.pause(0.05)
        screen = app.screen
        original = screen._compositor_refresh  # private, measured here only

        def timed_refresh() -> None:
            begin = time.perf_counter()
            original()
            paints.append((begin, time.perf_counter() - begin))

        screen._compositor_refresh = timed_refresh
        if world > 64:
            await pilot.press("down", "enter")  # expand one host, as a user would
        applied_before = app.applied
        apply_count = len(app.apply_times)
        begin = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - begin
        applied = app.applied - applied_before
        applies = list(app.apply_times)[apply_count:]
        screen._compositor_refresh = original
        rows = app.table.row_count
    paint_times = [d for when, d in paints if when >= begin]
    return {
        "world": world,
        "rows": rows,
        "refresh_per_s": applied / elapsed,
        "apply_median": statistics.median(applies),
        "apply_p95": percentile(applies, 0.95),
        "paint_median": statistics.median(paint_times) if paint_times else float("nan"),
        "paint_p95": percentile(paint_times, 0.95) if paint_times else float("nan"),
        "paints": len(paint_times),
        "events_per_s": source.events_f / max(time.time() - source.started, 1e-9),
        "poll_median": statistics.median(source.poll_times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=50)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(args.ranks, args.per_host, args.seconds, (args.width, args.height))
    )
    ok_refresh = result["refresh_per_s"] >= TARGET_REFRESH_PER_S
    ok_apply = result["apply_median"] < TARGET_APPLY_MEDIAN_S
    print(
        f"tui: {result['world']} ranks ({result['rows']} table rows, grouped by host), "
        f"{result['events_per_s']:.0f} events/s simulated, {args.width}x{args.height}, "
        f"{args.seconds:g} s headless"
    )
    print(
        f"  refreshes per second   {result['refresh_per_s']:.2f}  "
        f"(target >= {TARGET_REFRESH_PER_S:g}) {'ok' if ok_refresh else 'MISSED'}"
    )
    print(
        f"  apply one snapshot     median {result['apply_median'] * 1000:.1f} ms, "
        f"p95 {result['apply_p95'] * 1000:.1f} ms  "
        f"(target median < {TARGET_APPLY_MEDIAN_S * 1000:.0f} ms) {'ok' if ok_apply else 'MISSED'}"
    )
    print(
        f"  repaint                median {result['paint_median'] * 1000:.1f} ms, "
        f"p95 {result['paint_p95'] * 1000:.1f} ms ({result['paints']} repaints)"
    )
    print(f"  synthetic poll         median {result['poll_median'] * 1000:.1f} ms (poll thread)")
    return 0 if (ok_refresh and ok_apply) or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
