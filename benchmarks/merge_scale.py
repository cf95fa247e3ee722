"""Node 0's work per rank of the other nodes, measured at the rank counts cluster_scale cannot run.

    python benchmarks/merge_scale.py [--ranks 1024,2048,4096,8192] [--seconds 6] [--pairs 3]

benchmarks/cluster_scale.py runs real launchers, one process per node, and on this machine stops
at 32 nodes x 8 ranks; node 0's share of a core at 1024 nodes is extrapolated from there. This one
runs node 0's side alone, in this process, at up to 1024 nodes x 8 ranks: per simulated second,
the launcher of every other node publishes its summary (ddpdoctor's own Publisher, to a real file:
a rank's collective_start, collective_end, step and a heartbeat with its progress facts, as in
cluster_scale), and node 0 does what its launcher does with them: reads and parses each summary,
applies what is new (NodeMerge), and makes its snapshot and diagnosis twice, as it polls every
half second. Only node 0's part is timed (CPU time of this process). Its stats of the summaries,
its node records and its own ranks' files are per node or per local rank, not per remote rank,
and not in this figure (cluster_scale has them).

Each size runs in interleaved pairs: the garbage collector at CPython's default pace, and at the
pace `ddpdoctor run` and `watch` set (ddpdoctor/monitor/gc_pacing.py); reported per size:
microseconds per remote rank per second (median and spread of the pairs), what that is in share
of a core at that size, and the ratio of the two paces. Run it with an older ddpdoctor on
PYTHONPATH to compare code.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.monitor.diagnose import diagnose
from ddpdoctor.monitor.node_summaries import NodeMerge, Publisher
from ddpdoctor.monitor.snapshot import RunInfo
from ddpdoctor.monitor.state import RunState
from ddpdoctor.protocol.node_summary import read_node_summary
from ddpdoctor.protocol.rundir import RunDir

try:
    from ddpdoctor.monitor.gc_pacing import WATCHER_THRESHOLDS
except ImportError:  # an older ddpdoctor on PYTHONPATH, to compare: the same two paces
    WATCHER_THRESHOLDS = (5000, 10, 10)

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


class Cluster:
    """Node 0's state and merge, and the publishers of nodes 1..N-1, in one run directory."""

    def __init__(self, path: Path, world: int) -> None:
        self.run = RunDir.create(path)
        self.world = world
        self.nodes = range(1, world // PER_NODE)
        self.state = RunState(RunInfo(name="merge-scale", run_dir=str(path), world_size=world))
        self.merge = NodeMerge(self.run, self.state, _NoFiles(), own_node=0)
        # (an older ddpdoctor, run for comparison, named it _apply_summary)
        self._apply = getattr(self.merge, "apply_summary", None) or self.merge._apply_summary
        self.publishers = {node: Publisher(self.run, node) for node in self.nodes}
        self.lines: dict[int, int] = {}
        self.second = 0
        for node, publisher in self.publishers.items():
            for rank in self._ranks(node):
                self._note(publisher, rank, "hello", T0, pid=10_000 + rank, ppid=9_000 + node,
                           host=f"sim-node-{node}", local_rank=rank % PER_NODE,
                           group_rank=node, world_size=world, backend="gloo")  # fmt: skip

    def _ranks(self, node: int) -> range:
        return range(node * PER_NODE, (node + 1) * PER_NODE)

    def _note(self, publisher: Publisher, rank: int, kind: str, t: float, **fields) -> None:
        line = self.lines[rank] = self.lines.get(rank, 0) + 1
        publisher.note(rank, line, _event(rank, kind, t, **fields))

    def publish(self) -> float:
        """One second of every other node: its ranks' events, then its summary (not timed)."""
        self.second += 1
        s, t = self.second, T0 + self.second
        for node, publisher in self.publishers.items():
            for rank in self._ranks(node):
                self._note(publisher, rank, "collective_start", t, op="all_reduce",
                           group="default", seq=s, shapes=[[1000]], dtypes=["float32"])  # fmt: skip
                self._note(publisher, rank, "collective_end", t + 0.01, op="all_reduce",
                           group="default", seq=s, duration_s=0.01, ok=True)  # fmt: skip
                self._note(publisher, rank, "step", t + 0.02, step=s, step_time_s=1.0,
                           data_time_s=0.1, compute_time_s=0.8, comm_wait_s=0.01)  # fmt: skip
                self._note(publisher, rank, "heartbeat", t + 0.03, step=s, cpu_s=0.5 * s,
                           frame=f"train.py:{s % 7}")  # fmt: skip
            publisher.maybe_publish(t + 0.04, self._ranks(node), force=True)
        return t

    def node0(self, t: float) -> None:
        """Node 0's second: every summary read and merged, two polls' snapshots and diagnoses."""
        standing = set(self.nodes)
        for node in self.nodes:
            summary = read_node_summary(self.run, node)
            if summary is not None:
                self._apply(node, summary, standing)
        for at in (t + 0.1, t + 0.6):
            diagnose(self.state.snapshot(at, hang_after=5.0))


def cost_per_rank_s(world: int, seconds: int, thresholds: tuple[int, ...]) -> float:
    """Node 0's CPU microseconds per remote rank per second, at `world` ranks."""
    gc.set_threshold(*thresholds)
    try:
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-merge-") as tmp:
            cluster = Cluster(Path(tmp) / "run", world)
            for _ in range(3):  # warm up: the hellos, every rank followed, history filled
                cluster.node0(cluster.publish())
            spent = 0.0
            for _ in range(seconds):
                t = cluster.publish()
                began = time.process_time()
                cluster.node0(t)
                spent += time.process_time() - began
            remote = world - PER_NODE
            return spent / seconds / remote * 1e6
    finally:
        gc.set_threshold(*DEFAULT_THRESHOLDS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,2048,4096,8192")
    parser.add_argument("--seconds", type=int, default=6, help="measured seconds per run")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'ranks':>6} {'default GC us/rank/s':>21} {'paced us/rank/s':>16} "
        f"{'node 0, paced':>14} {'paced/default':>14}"
    )
    for world in (int(w) for w in args.ranks.split(",")):
        runs: dict[str, list[float]] = {"default": [], "paced": []}
        for i in range(args.pairs):
            order = ["default", "paced"] if i % 2 == 0 else ["paced", "default"]
            for name in order:
                thresholds = DEFAULT_THRESHOLDS if name == "default" else WATCHER_THRESHOLDS
                runs[name].append(cost_per_rank_s(world, args.seconds, thresholds))
        default, paced = (statistics.median(runs[k]) for k in ("default", "paced"))
        spread = {k: (min(v), max(v)) for k, v in runs.items()}
        core = paced * (world - PER_NODE) / 1e6
        print(
            f"{world:>6} {default:>9.1f} ({spread['default'][0]:.0f}-{spread['default'][1]:.0f})"
            f"{'':>3} {paced:>7.1f} ({spread['paced'][0]:.0f}-{spread['paced'][1]:.0f})"
            f" {100 * core:>12.1f}% {paced / default:>14.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
