"""How the monitor scales: a synthetic run of many ranks written to real files while it watches.

1. Live: a feeder process appends events for R ranks at 5 events/s each (heartbeat, a step, a
   collective start and end, metrics) to RUN_DIR/events/rank-<R>.jsonl, line by line as ranks
   do; this process polls a Monitor twice a second, as the launcher and the TUI do. The monitor's
   share of a core is this process's CPU time over wall time (the feeder is another process).
2. Snapshot cost: the time of one poll (diagnosis included) for 128, 256, 512 and 1024 ranks with
   a history already read, to show it grows linearly.
3. Ingest rate: parse + apply of a backlog, in events per second.

    python benchmarks/monitor_scale.py [--ranks 1024] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.monitor import Monitor
from ddpdoctor.protocol.rundir import RunDir

EVENTS_PER_RANK_S = 5
POLL_S = 0.5
TARGET_CORE_SHARE = 0.25


def rank_events(rank: int, tick: int, t: float, world: int) -> list[str]:
    """One second of one rank: 5 events."""
    seq = tick + 1
    base = {"v": 1, "mono": t, "rank": rank}

    def line(kind: str, dt: float, **fields) -> str:
        return json.dumps({**base, "t": t + dt, "kind": kind, **fields}, separators=(",", ":"))

    return [
        line(
            "collective_start",
            0.0,
            op="all_reduce",
            seq=seq,
            group="default",
            group_size=world,
            shapes=[[1_000_000]],
            dtypes=["float32"],
            numel=1_000_000,
            **{"async": True},
            bucket=0,
        ),
        line(
            "collective_end",
            0.05,
            op="all_reduce",
            seq=seq,
            group="default",
            duration_s=0.05,
            ok=True,
            error=None,
        ),
        line(
            "step",
            0.3,
            step=seq,
            epoch=0,
            loss=2.0 / seq,
            batch_size=32,
            step_time_s=0.3,
            data_time_s=0.02,
            compute_time_s=0.23,
            comm_wait_s=0.05,
            samples_per_s=106.0,
        ),
        line("metrics", 0.31, step=seq, loss=2.0 / seq),
        line(
            "heartbeat",
            0.5,
            seq=tick,
            step=seq,
            epoch=0,
            phase="train",
            rss_bytes=1 << 30,
            gpu_mem_bytes=None,
            open=None,
            collectives_started=seq,
            collectives_done=seq,
        ),
    ]


def write_hello(run: RunDir, world: int, per_host: int = 8) -> None:
    run.run_json.write_text(json.dumps({"world_size": world, "backend": "nccl"}))
    for rank in range(world):
        hello = {
            "v": 1,
            "t": time.time(),
            "mono": 0.0,
            "rank": rank,
            "kind": "hello",
            "local_rank": rank % per_host,
            "world_size": world,
            "host": f"node{rank // per_host:03d}",
            "pid": 10_000 + rank,
            "backend": "nccl",
        }
        with open(run.events_file(rank), "w") as fh:
            fh.write(json.dumps(hello) + "\n")


def feeder(path: str, world: int, seconds: float, ready) -> None:
    """Appends one second of events for every rank, once a second, spread over the second."""
    run = RunDir(Path(path))
    ready.set()
    start = time.time()
    tick = 0
    while time.time() - start < seconds:
        t = time.time()
        for rank in range(world):
            with open(run.events_file(rank), "a") as fh:
                fh.write("\n".join(rank_events(rank, tick, t, world)) + "\n")
        tick += 1
        time.sleep(max(0.0, start + tick - time.time()))


def live(world: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-scale-") as tmp:
        run = RunDir.create(Path(tmp) / "run")
        write_hello(run, world)
        monitor = Monitor(run, capture_stacks=False, write_diagnosis=False, explain_logs=False)
        monitor.poll()
        ready = mp.Event()
        proc = mp.Process(target=feeder, args=(str(run.path), world, seconds, ready))
        proc.start()
        ready.wait()
        wall0, cpu0 = time.monotonic(), time.process_time()
        applied0 = monitor.state.events_applied
        poll_times = []
        while proc.is_alive():
            t0 = time.perf_counter()
            snap = monitor.poll()
            poll_times.append(time.perf_counter() - t0)
            time.sleep(max(0.0, POLL_S - (time.perf_counter() - t0)))
        proc.join()
        snap = monitor.poll()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        events = monitor.state.events_applied - applied0
        assert len(snap.ranks) == world and snap.verdict.value == "running", snap.verdict
        return {
            "share": cpu / wall,
            "events_per_s": events / wall,
            "poll_median_ms": 1000 * statistics.median(poll_times),
            "poll_p95_ms": 1000 * sorted(poll_times)[int(0.95 * (len(poll_times) - 1))],
        }


def snapshot_cost(world: int, history_s: int = 20, repeats: int = 9) -> float:
    """Best-of-`repeats` time of one poll with nothing new to read (state -> snapshot ->
    diagnosis): the minimum filters out other processes taking the CPU on a shared machine."""
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-scale-") as tmp:
        run = RunDir.create(Path(tmp) / "run")
        write_hello(run, world)
        t = time.time() - history_s
        for rank in range(world):
            with open(run.events_file(rank), "a") as fh:
                for tick in range(history_s):
                    fh.write("\n".join(rank_events(rank, tick, t + tick, world)) + "\n")
        monitor = Monitor(run, capture_stacks=False, write_diagnosis=False, explain_logs=False)
        monitor.poll()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            monitor.poll()
            times.append(time.perf_counter() - t0)
        return min(times)


def ingest_rate(world: int = 256, seconds_of_events: int = 40) -> float:
    """Events per second through parse + apply, from a backlog already on disk."""
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-scale-") as tmp:
        run = RunDir.create(Path(tmp) / "run")
        write_hello(run, world)
        t = time.time() - seconds_of_events
        for rank in range(world):
            with open(run.events_file(rank), "a") as fh:
                for tick in range(seconds_of_events):
                    fh.write("\n".join(rank_events(rank, tick, t + tick, world)) + "\n")
        monitor = Monitor(run, capture_stacks=False, write_diagnosis=False, explain_logs=False)
        t0 = time.perf_counter()
        monitor.poll()
        elapsed = time.perf_counter() - t0
        return monitor.state.events_applied / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(f"monitor scale on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    result = live(args.ranks, args.seconds)
    rate = args.ranks * EVENTS_PER_RANK_S
    print(
        f"live: {args.ranks} ranks x {EVENTS_PER_RANK_S} events/s = {rate} events/s for "
        f"{args.seconds:g} s: monitor used {100 * result['share']:.1f}% of one core "
        f"(target < {100 * TARGET_CORE_SHARE:.0f}%), ingested {result['events_per_s']:.0f} events/s, "
        f"poll median {result['poll_median_ms']:.1f} ms, p95 {result['poll_p95_ms']:.1f} ms"
    )
    print("snapshot + diagnosis per poll (nothing new to read; best of 9):")
    costs = {}
    for world in (128, 256, 512, 1024):
        costs[world] = snapshot_cost(world)
        print(
            f"  {world:5d} ranks: {1000 * costs[world]:7.1f} ms "
            f"({1e6 * costs[world] / world:.1f} µs per rank)"
        )
    growth = costs[1024] / costs[128]
    print(f"  1024 vs 128 ranks: x{growth:.1f} for x8 ranks (linear: x8)")
    print(f"ingest (parse + apply) from a backlog: {ingest_rate():.0f} events/s")
    ok = result["share"] < TARGET_CORE_SHARE
    print(f"result: {'PASS' if ok else 'FAIL'} ({100 * result['share']:.1f}% of one core)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
