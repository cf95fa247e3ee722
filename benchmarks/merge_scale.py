"""Node 0's work per rank of the other nodes, measured at the rank counts cluster_scale cannot run.

    python benchmarks/merge_scale.py [--ranks 1024,2048,4096,8192] [--seconds 6] [--pairs 3]
                                     [--steps-per-s 1]

benchmarks/cluster_scale.py runs real launchers, one process per node, and on this machine stops
at 32 nodes x 8 ranks. This one runs node 0's side alone, at up to 1024 nodes x 8 ranks. A child
process plays the launchers of every other node: per simulated second each of their ranks writes
its events (per step two gradient buckets' collective_start and collective_end, then a step; a
heartbeat with its progress facts once a second; each rank with its own clock offset, timings,
CPU and memory), each node's launcher folds them into its own record of its ranks, as it does on
its own node, and publishes its summary (ddpdoctor's own Publisher, to a real file). Node 0, in
this process, does what its launcher does with them: reads and parses each summary, merges it
(NodeMerge), and makes its snapshot and diagnosis twice, as it polls every half second. Only node
0's part is timed (CPU time of this process, at the collector pace `ddpdoctor run` and `watch`
set: ddpdoctor/monitor/pipeline/gc_pacing.py). Its stats of the summaries, its node records and its own
ranks' files are per node or per local rank, not per remote rank, and not in this figure
(cluster_scale has them).

Each size runs in interleaved pairs: summaries whose routine ranks come as rows
(ddpdoctor/monitor/follow/rank_rows.py), against the same summaries with every rank's events instead,
as before rows (the baseline). Reported per size: microseconds per remote rank per second (median
and spread of the pairs), node 0's share of one core with rows, and the ratio.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.monitor.follow.node_publisher import Publisher
from ddpdoctor.monitor.follow.node_summaries import NodeMerge
from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.model.snapshot import RunInfo
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.pipeline.gc_pacing import WATCHER_THRESHOLDS
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.rundir import RunDir

PER_NODE = 8
T0 = 1_700_000_000.0
DEFAULT_THRESHOLDS = gc.get_threshold()


class _NoFiles:
    """The tailer NodeMerge pauses a rank's file on: here there are no rank files to read."""

    def pause(self, rank: int) -> None:
        pass

    def resume(self, rank: int) -> None:
        pass


def _event(rank: int, kind: str, t: float, **fields) -> dict:
    return {"v": 1, "t": t, "mono": t - T0, "rank": rank, "kind": kind, **fields}


class Followers:
    """The launchers of nodes 1..N-1: each its own ranks' record and publisher. They run in a
    child process (`FollowerProcess`), as they do on their own nodes: their records are not in
    node 0's heap, where its garbage collector would walk them."""

    def __init__(self, path: Path, world: int, steps_per_s: int = 1, rows: bool = True) -> None:
        self.run = RunDir(path)
        self.steps_per_s = steps_per_s
        self.rows = rows
        self.nodes = range(1, world // PER_NODE)
        info = RunInfo(name="merge-scale", run_dir=str(path), world_size=world)
        self.publishers = {node: Publisher(self.run, node) for node in self.nodes}
        # each node's launcher's own record of its ranks, which its rows are made from
        self.states = {node: RunState(info) for node in self.nodes}
        self.lines: dict[int, int] = {}
        self.second = 0
        for node, publisher in self.publishers.items():
            for rank in _ranks(node):
                self._note(publisher, rank, "hello", T0, pid=10_000 + rank, ppid=9_000 + node,
                           host=f"sim-node-{node}", local_rank=rank % PER_NODE,
                           group_rank=node, world_size=world, backend="gloo")  # fmt: skip

    def _note(self, publisher: Publisher, rank: int, kind: str, t: float, **fields) -> None:
        line = self.lines[rank] = self.lines.get(rank, 0) + 1
        event = _event(rank, kind, t, **fields)
        self.states[rank // PER_NODE].apply(event)
        publisher.note(rank, line, event)

    def publish(self) -> float:
        """One second of every other node: its ranks' events, then its summary."""
        self.second += 1
        t = T0 + self.second
        n = self.steps_per_s
        for node, publisher in self.publishers.items():
            for rank in _ranks(node):
                # each rank its own clock offset, step timings and CPU, as real ranks have
                jitter = random.Random(rank * 100_003 + self.second)
                skew = jitter.uniform(0.0, 0.01)
                for i in range(n):  # each step: two gradient buckets' all_reduce
                    step = (self.second - 1) * n + i + 1
                    at = t + skew + i / n * 0.9
                    for bucket in (0, 1):
                        seq = 2 * step + bucket
                        self._note(publisher, rank, "collective_start", at, op="all_reduce",
                                   group="default", seq=seq, shapes=[[1000]],
                                   dtypes=["float32"])  # fmt: skip
                        self._note(publisher, rank, "collective_end", at + 0.01, op="all_reduce",
                                   group="default", seq=seq, duration_s=jitter.uniform(0, 0.02),
                                   ok=True)  # fmt: skip
                    self._note(publisher, rank, "step", at + 0.02, step=step,
                               step_time_s=jitter.uniform(0.95, 1.05) / n,
                               data_time_s=jitter.uniform(0.05, 0.15) / n,
                               compute_time_s=jitter.uniform(0.75, 0.85) / n,
                               comm_wait_s=jitter.uniform(0, 0.02))  # fmt: skip
                self._note(publisher, rank, "heartbeat", t + skew + 0.93, step=self.second * n,
                           cpu_s=0.95 * self.second + jitter.uniform(0, 0.01),
                           rss_bytes=2_000_000_000 + jitter.randrange(1 << 20),
                           frame=f"train.py:{self.second % 7} step")  # fmt: skip
            if self.rows:
                publisher.maybe_publish(
                    t + 0.94, _ranks(node), force=True, trackers=self.states[node].ranks
                )
            else:  # the baseline: every rank's events, as before rows
                publisher.maybe_publish(t + 0.94, _ranks(node), force=True)
        return t


def _ranks(node: int) -> range:
    return range(node * PER_NODE, (node + 1) * PER_NODE)


def _serve(conn, path: Path, world: int, steps_per_s: int, rows: bool) -> None:
    followers = Followers(path, world, steps_per_s, rows)
    while conn.recv():
        conn.send(followers.publish())


class FollowerProcess:
    """`Followers` in a child process: `publish()` asks it for one more second."""

    def __init__(self, path: Path, world: int, steps_per_s: int = 1, rows: bool = True) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, path, world, steps_per_s, rows), daemon=True
        )
        self.process.start()

    def publish(self) -> float:
        self.conn.send(True)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(False)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


class Cluster:
    """Node 0's state and merge, fed by the other nodes' launchers in a child process."""

    def __init__(self, path: Path, world: int, steps_per_s: int = 1, rows: bool = True) -> None:
        self.run = RunDir.create(path)
        self.world = world
        self.nodes = range(1, world // PER_NODE)
        self.state = RunState(RunInfo(name="merge-scale", run_dir=str(path), world_size=world))
        self.merge = NodeMerge(self.run, self.state, _NoFiles(), own_node=0)
        # every node's record, as node 0 reads them from nodes/node-<N>/node.json
        self.records = {
            node: NodeRecord(
                node, f"sim-node-{node}", 90_000 + node, torchrun_pid=9_000 + node, nproc=PER_NODE
            )
            for node in range(world // PER_NODE)
        }
        self.state.set_nodes(self.records)
        self.followers = FollowerProcess(path, world, steps_per_s, rows)

    def publish(self) -> float:
        return self.followers.publish()

    def close(self) -> None:
        self.followers.close()

    def node0(self, t: float) -> None:
        """Node 0's second: two polls, each merging what changed in the summaries (a stat per
        node, a read of each new one), then its snapshot and diagnosis."""
        for at in (t + 0.95, t + 1.45):
            self.merge.merge(at, self.records, final=False)
            diagnose(self.state.snapshot(at, hang_after=5.0))


def cost_per_rank_s(
    world: int,
    seconds: int,
    thresholds: tuple[int, ...] = WATCHER_THRESHOLDS,
    steps_per_s: int = 1,
    rows: bool = True,
) -> float:
    """Node 0's CPU microseconds per remote rank per second, at `world` ranks."""
    gc.set_threshold(*thresholds)
    try:
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-merge-") as tmp:
            cluster = Cluster(Path(tmp) / "run", world, steps_per_s, rows)
            try:
                for _ in range(3):  # warm up: the hellos, every rank followed, history filled
                    cluster.node0(cluster.publish())
                spent = 0.0
                for _ in range(seconds):
                    t = cluster.publish()
                    began = time.process_time()
                    cluster.node0(t)
                    spent += time.process_time() - began
            finally:
                cluster.close()
            remote = world - PER_NODE
            return spent / seconds / remote * 1e6
    finally:
        gc.set_threshold(*DEFAULT_THRESHOLDS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,2048,4096,8192")
    parser.add_argument("--seconds", type=int, default=6, help="measured seconds per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument(
        "--steps-per-s", type=int, default=1, help="each rank's steps per second (2 buckets each)"
    )
    args = parser.parse_args()
    print(f"{args.steps_per_s} step(s) per second per rank, the watcher's collector pace")
    print(
        f"{'ranks':>6} {'events us/rank/s':>17} {'rows us/rank/s':>15} "
        f"{'node 0, rows':>13} {'rows/events':>12}"
    )
    for world in (int(w) for w in args.ranks.split(",")):
        runs: dict[str, list[float]] = {"events": [], "rows": []}
        for i in range(args.pairs):
            order = ["events", "rows"] if i % 2 == 0 else ["rows", "events"]
            for name in order:
                runs[name].append(
                    cost_per_rank_s(
                        world, args.seconds, steps_per_s=args.steps_per_s, rows=name == "rows"
                    )
                )
        events, rows = (statistics.median(runs[k]) for k in ("events", "rows"))
        spread = {k: (min(v), max(v)) for k, v in runs.items()}
        core = rows * (world - PER_NODE) / 1e6
        print(
            f"{world:>6} {events:>7.1f} ({spread['events'][0]:.0f}-{spread['events'][1]:.0f})"
            f"{'':>2} {rows:>7.1f} ({spread['rows'][0]:.0f}-{spread['rows'][1]:.0f})"
            f" {100 * core:>11.1f}% {rows / events:>12.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
