"""A cluster on one machine: N nodes' launchers watching 8 synthetic ranks each in one shared run directory.

    python benchmarks/cluster_scale.py [--nodes 1,2,4,8,16,32] [--ranks 8] [--seconds 20] [--json]

For each N: one process per node runs ddpdoctor's own Monitor as that node's launcher does
(`Monitor(run, node_rank=n)` polled every 0.5 s, and its stack-request responder), and writer processes append real events for the
N x 8 ranks (hello, then every second per rank a collective_start / collective_end / step and a
heartbeat), each rank's hello naming its node's host and torchrun as the real runtime's does.
After a warm-up, a window of `--seconds` is measured; then one rank of the last node hangs (it
stops before the next all-reduce, the others wait in it) and the time until node 0's launcher
writes a hang verdict to diagnosis.json is taken.

Reported per N:
  ops/s       file operations on the shared run directory by all launchers together, per second:
              stat, open (each followed by one read of what is new), directory listings, renames,
              temp files (counted in each launcher process by wrapping the os functions)
  CPU/launcher  median CPU of the launchers of nodes 1..N-1 (% of one core)
  node 0 CPU  node 0's launcher (% of one core): it merges every node's summary
  detect      seconds from the hang to node 0's verdict (hang threshold `--hang-after`, 5 s)

CLUSTER_SCALE_PROFILE=FILE writes a cProfile of node 0's launcher over the measured window to FILE
(read it with `python -m pstats FILE`; the profiler slows what it measures, so the CPU figures of
that run are not comparable). CLUSTER_SCALE_NODE0_PID=FILE writes node 0's pid to FILE, for a
sampling profiler that does not (`py-spy record -p PID -f raw`).

Run it with an older ddpdoctor on PYTHONPATH to see the flat design (every launcher reads every
rank's file) on the same machine.
"""

from __future__ import annotations

import argparse
import builtins
import io
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.5
STEP_S = 1.0
HANG_AFTER_S = 5.0
TORCHRUN_PID0 = 3_000_000  # the fake torchrun pid of node n is TORCHRUN_PID0 + n


def host_of(node: int) -> str:
    return f"sim-node-{node}"


# -- launchers ----------------------------------------------------------------------------------


def count_ops(root: str, counter: list[int]) -> None:
    """Wrap the os functions a monitor reaches the file system through; count calls on `root`."""

    def wrap(fn):
        def counted(path, *args, **kwargs):
            if str(path if not isinstance(path, int) else "").startswith(root):
                counter[0] += 1
            return fn(path, *args, **kwargs)

        return counted

    for name in ("stat", "lstat", "open", "scandir", "listdir", "mkdir", "unlink"):
        setattr(os, name, wrap(getattr(os, name)))
    builtins.open = io.open = wrap(io.open)  # type: ignore[assignment]
    replace = os.replace

    def counted_replace(src, dst, *args, **kwargs):
        if str(dst).startswith(root):
            counter[0] += 1
        return replace(src, dst, *args, **kwargs)

    os.replace = counted_replace


def launcher(run_dir: str, node: int, stop_at: float, window, ready, out, done):
    """`window`: shared (start, end) unix times, set once every launcher is `ready`."""
    from ddpdoctor.monitor import Monitor  # in the child: imported after the fork
    from ddpdoctor.stacks.responder import StackResponder

    ops = [0]
    count_ops(run_dir, ops)
    if not os.environ.get("CLUSTER_SCALE_DEFAULT_GC"):
        from ddpdoctor.monitor.pipeline.gc_pacing import pace_for_watching

        pace_for_watching()  # as `ddpdoctor run` does
    monitor = Monitor(
        run_dir,
        node_rank=node,
        hang_after=HANG_AFTER_S,
        capture_stacks=False,
        explain_logs=False,
        write_diagnosis=node == 0,
    )
    responder = StackResponder(monitor.run, node)  # as the launcher: answers stack requests
    with ready.get_lock():
        ready.value += 1
    marks: dict[str, tuple[float, int]] = {}
    profile_to = os.environ.get("CLUSTER_SCALE_PROFILE") if node == 0 else None
    if node == 0 and os.environ.get("CLUSTER_SCALE_NODE0_PID"):  # for a sampling profiler
        Path(os.environ["CLUSTER_SCALE_NODE0_PID"]).write_text(str(os.getpid()))
    profiler = None
    while time.time() < stop_at and not (done.is_set() and "end" in marks):
        began = time.time()
        snap = monitor.poll()
        responder.poll(monitor.node_ranks(snap))
        now = time.time()
        for name, at in (("start", window[0]), ("end", window[1])):
            if name not in marks and 0 < at <= now:
                marks[name] = (time.process_time(), ops[0])
                if profile_to and name == "start":  # node 0's measured window, profiled
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                elif profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(profile_to)
                    profiler = None
        time.sleep(max(0.0, POLL_S - (time.time() - began)))
    if "start" not in marks or "end" not in marks:  # this machine could not keep up
        out.put((node, None, None))
        return
    (cpu0, ops0), (cpu1, ops1) = marks["start"], marks["end"]
    span = window[1] - window[0]
    out.put((node, (cpu1 - cpu0) / span, (ops1 - ops0) / span))


# -- synthetic ranks ----------------------------------------------------------------------------


def line(rank: int, kind: str, t: float, **fields) -> str:
    return json.dumps({"v": 1, "t": t, "mono": t, "rank": rank, "kind": kind, **fields}) + "\n"


def writer(run_dir, nodes: list[int], per_node: int, world: int, stop_at: float, hang_at, done):
    """The ranks of some nodes: one event file each, kept open, appended to as ranks do."""
    files = {}
    for node in nodes:
        for local in range(per_node):
            rank = node * per_node + local
            fh = open(Path(run_dir) / "events" / f"rank-{rank}.jsonl", "a")  # noqa: SIM115
            files[rank] = fh
            t = time.time()
            fh.write(
                line(rank, "hello", t, local_rank=local, world_size=world, host=host_of(node),
                     pid=1_000_000 + rank, ppid=TORCHRUN_PID0 + node, group_rank=node,
                     backend="gloo", heartbeat_s=1.0)
                + line(rank, "phase", t, phase="train")
            )  # fmt: skip
            fh.flush()
    culprit = world - 1  # a rank of the last node
    seq = 0
    next_t = time.time()
    while time.time() < stop_at and not done.is_set():
        t = time.time()
        hung = t >= hang_at.value > 0
        if not hung:
            seq += 1
        for rank, fh in files.items():
            if hung:
                stuck = rank == culprit
                opened = None if stuck else {"op": "all_reduce", "seq": seq + 1, "group": "default",
                                             "since_t": hang_at.value}  # fmt: skip
                if not stuck and not getattr(fh, "started", False):
                    fh.write(line(rank, "collective_start", hang_at.value, op="all_reduce",
                                  seq=seq + 1, group="default", shapes=[[1024]],
                                  dtypes=["float32"]))  # fmt: skip
                    fh.started = True  # type: ignore[attr-defined]
                fh.write(line(rank, "heartbeat", t, step=seq, phase="train", open=opened))
            else:
                fh.write(
                    line(rank, "collective_start", t, op="all_reduce", seq=seq, group="default",
                         shapes=[[1024]], dtypes=["float32"])
                    + line(rank, "collective_end", t + 0.01, op="all_reduce", seq=seq,
                           group="default", duration_s=0.01, ok=True)
                    + line(rank, "step", t + 0.02, step=seq, epoch=0, step_time_s=STEP_S,
                           data_time_s=0.1, compute_time_s=0.8, comm_wait_s=0.1)
                    + line(rank, "heartbeat", t + 0.02, step=seq, phase="train", open=None)
                )  # fmt: skip
            fh.flush()
        next_t += STEP_S
        time.sleep(max(0.0, next_t - time.time()))


# -- one cluster size ---------------------------------------------------------------------------


def measure(nodes: int, per_node: int, seconds: float, warmup: float) -> dict:
    from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
    from ddpdoctor.protocol.rundir import RunDir

    with tempfile.TemporaryDirectory(prefix="ddpdoctor-cluster-") as tmp:
        run = RunDir.create(Path(tmp) / "run")
        world = nodes * per_node
        run.run_json.write_text(
            json.dumps({"world_size": world, "nnodes": nodes, "backend": "gloo"})
        )
        for node in range(nodes):
            write_node_record(
                run,
                NodeRecord(node, host_of(node), 2_000_000 + node, TORCHRUN_PID0 + node,
                           nproc=per_node, started_t=time.time()),
            )  # fmt: skip
        ctx = mp.get_context("fork")
        window = ctx.Array("d", [0.0, 0.0])
        ready = ctx.Value("i", 0)
        hang_at = ctx.Value("d", 0.0)
        stop_at = time.time() + 600.0  # a bound only: the run ends once the hang is found
        out = ctx.Queue()
        done = ctx.Event()
        procs = [
            ctx.Process(
                target=launcher,
                args=(str(run.path), n, stop_at, window, ready, out, done),
            )
            for n in range(nodes)
        ]
        writers = max(1, min(4, nodes // 8))
        for w in range(writers):
            mine = list(range(w, nodes, writers))
            procs.append(
                ctx.Process(
                    target=writer,
                    args=(str(run.path), mine, per_node, world, stop_at, hang_at, done),
                )
            )
        for p in procs:
            p.start()
        while ready.value < nodes and time.time() < stop_at:
            time.sleep(0.1)  # the window starts once every launcher polls
        window[0] = time.time() + warmup
        window[1] = window[0] + seconds
        stop_at = window[1] + 4 * HANG_AFTER_S + 30.0
        time.sleep(max(0.0, window[1] - time.time()))
        hang_at.value = time.time() + 0.5
        detect = None
        while time.time() < stop_at - 1:
            try:
                doc = json.loads(run.diagnosis_json.read_text())
            except (OSError, ValueError):
                doc = {}
            if doc.get("verdict") == "hang":
                detect = time.time() - hang_at.value
                culprits = doc.get("culprits")
                break
            time.sleep(0.1)
        done.set()
        results = {}
        for _ in range(nodes):
            try:
                node, cpu, ops = out.get(timeout=max(1.0, stop_at - time.time() + 30))
            except queue.Empty:
                break
            if cpu is not None:
                results[node] = (cpu, ops)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if 0 not in results or len(results) < nodes:
            raise SystemExit(
                f"{nodes} nodes: {nodes - len(results)} launchers did not poll through the "
                "measured window: this machine cannot run that many"
            )
        others = [results[n][0] for n in range(1, nodes)] or [results[0][0]]
        return {
            "nodes": nodes,
            "ranks": world,
            "ops_per_s": sum(ops for _, ops in results.values()),
            "cpu_per_launcher_pct": 100 * statistics.median(others),
            "node0_cpu_pct": 100 * results[0][0],
            "detect_s": detect,
            "culprits": culprits if detect is not None else None,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,4,8,16,32")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    print("nodes  ranks   ops/s  ops/s/node  CPU/launcher  node 0 CPU  detect (hang_after 5 s)")
    for n in (int(x) for x in args.nodes.split(",")):
        row = measure(n, args.ranks, args.seconds, args.warmup)
        rows.append(row)
        detect = f"{row['detect_s']:.1f} s" if row["detect_s"] is not None else "not found"
        print(
            f"{row['nodes']:5d}  {row['ranks']:5d}  {row['ops_per_s']:6.0f}  "
            f"{row['ops_per_s'] / n:10.1f}  {row['cpu_per_launcher_pct']:11.2f}%  "
            f"{row['node0_cpu_pct']:9.2f}%  {detect} culprits {row['culprits']}",
            flush=True,
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
