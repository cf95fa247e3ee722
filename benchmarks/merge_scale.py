"""Node 0's work per rank of the other nodes, measured at the rank counts cluster_scale cannot run.

    python benchmarks/merge_scale.py [--ranks 1024,2048,4096,8192] [--seconds 6] [--pairs 3]
                                     [--steps-per-s 1] [--cache DIR] [--hang] [--profile N]

benchmarks/cluster_scale.py runs real launchers, one process per node, and on this machine stops
at 32 nodes x 8 ranks. This one runs node 0's side alone, at up to 4096 nodes x 8 ranks. The
other nodes' launchers are simulated ahead of time, untimed, in a child process
(benchmarks/merge_sim.py: their ranks' events, each node's own record of its ranks, its summary
made by ddpdoctor's own Publisher), and published second by second as a launcher does, a new
file renamed over the last (`--cache DIR` keeps them for the next run of the same size). Node 0,
in this process, does what its launcher does with them: reads and parses each summary, merges it
(NodeMerge), and makes its snapshot and diagnosis twice, as it polls every half second. Only node
0's part is timed (CPU time of this process, at the collector pace `ddpdoctor run` and `watch`
set: ddpdoctor/monitor/pipeline/gc_pacing.py). Its stats of the summaries, its node records and its own
ranks' files are per node or per local rank, not per remote rank, and not in this figure
(cluster_scale has them).

Each size runs in interleaved pairs: summaries whose routine ranks come as rows
(ddpdoctor/monitor/follow/rank_rows.py), against the same summaries with every rank's events instead,
as before rows (the baseline). Reported per size: microseconds per remote rank per second (median
and spread of the pairs), node 0's share of one core with rows, and the ratio. `--hang`: then one
node's ranks stop (merge_sim.Hang) and the simulated seconds from that moment until node 0's
diagnosis says hang, naming that node's ranks; `--profile N`: cProfile of node 0 (rows).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from merge_sim import PER_NODE, Hang, Replay, pregenerate, ranks_of

from ddpdoctor.monitor.follow.node_summaries import NodeMerge
from ddpdoctor.monitor.judge.diagnose import Diagnosis, diagnose
from ddpdoctor.monitor.model.snapshot import RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.pipeline.gc_pacing import thresholds_for
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.rundir import RunDir

DEFAULT_THRESHOLDS = gc.get_threshold()
WARM_UP_S = 3  # the hellos, every rank followed, history filled
HANG_AFTER_S = 5.0


class _NoFiles:
    """The tailer NodeMerge pauses a rank's file on: here there are no rank files to read."""

    def pause(self, rank: int) -> None:
        pass

    def resume(self, rank: int) -> None:
        pass


class Cluster:
    """Node 0's state and merge, fed the other nodes' summaries (made ahead: merge_sim)."""

    def __init__(
        self,
        path: Path,
        world: int,
        steps_per_s: int = 1,
        rows: bool = True,
        *,
        folder: Path | None = None,
        seconds: int = 8,
        hang: Hang | None = None,
    ) -> None:
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
        if folder is None:
            folder = pregenerate(path.parent / "sim", world, seconds, steps_per_s, hang)
        self.replay = Replay(self.run, folder, "rows" if rows else "events")

    def publish(self) -> float:
        return self.replay.publish()

    def node0(self, t: float) -> list[tuple[float, Diagnosis]]:
        """Node 0's second: two polls, each merging what changed in the summaries (a stat per
        node, a read of each new one), then its snapshot and diagnosis. (time, diagnosis) each."""
        polls = []
        for at in (t + 0.95, t + 1.45):
            self.merge.merge(at, self.records, final=False)
            polls.append((at, diagnose(self.state.snapshot(at, hang_after=HANG_AFTER_S))))
        return polls


def cost_per_rank_s(
    world: int,
    seconds: int,
    thresholds: tuple[int, ...] | None = None,
    steps_per_s: int = 1,
    rows: bool = True,
    folder: Path | None = None,
    profile: cProfile.Profile | None = None,
) -> float:
    """Node 0's CPU microseconds per remote rank per second, at `world` ranks (at the collector
    pace of a watcher of `world` ranks unless `thresholds` says another)."""
    gc.set_threshold(*(thresholds or thresholds_for(world)))
    try:
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-merge-") as tmp:
            cluster = Cluster(
                Path(tmp) / "run", world, steps_per_s, rows, folder=folder,
                seconds=WARM_UP_S + seconds,
            )  # fmt: skip
            for _ in range(WARM_UP_S):
                cluster.node0(cluster.publish())
            spent = 0.0
            for _ in range(seconds):
                t = cluster.publish()
                if profile is not None:
                    profile.enable()
                began = time.process_time()
                cluster.node0(t)
                spent += time.process_time() - began
                if profile is not None:
                    profile.disable()
            remote = world - PER_NODE
            return spent / seconds / remote * 1e6
    finally:
        gc.set_threshold(*DEFAULT_THRESHOLDS)


def hang_latency(world: int, folder: Path, hang: Hang) -> tuple[float | None, bool]:
    """(seconds from the moment the hung node's ranks stopped to node 0's first HANG verdict,
    whether its culprits are that node's ranks: those and node 0's own, which this benchmark
    never starts, so that they never reach the call either). None: no hang named."""
    gc.set_threshold(*thresholds_for(world))
    try:
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-hang-") as tmp:
            cluster = Cluster(Path(tmp) / "run", world, folder=folder)
            stopped = None
            for second in range(1, cluster.replay.seconds + 1):
                t = cluster.publish()
                if second == hang.second:
                    stopped = t  # (its last step ended in the second before)
                for at, diagnosis in cluster.node0(t):
                    if diagnosis.verdict is Verdict.HANG and stopped is not None:
                        named = set(diagnosis.culprits) - set(ranks_of(0))
                        return at - stopped, named == set(ranks_of(hang.node))
                    assert diagnosis.verdict is Verdict.RUNNING, diagnosis.verdict  # no false alarm
            return None, False
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
    parser.add_argument(
        "--cache", type=Path, help="keep the other nodes' summaries here, for the next run"
    )
    parser.add_argument(
        "--hang", action="store_true", help="also: how long until node 0 names a hung node"
    )
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile node 0, top N lines")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-sim-") as tmp:
        return _run(args, args.cache or Path(tmp))


def _run(args: argparse.Namespace, cache: Path) -> int:
    print(f"{args.steps_per_s} step(s) per second per rank, the watcher's collector pace")
    print(
        f"{'ranks':>6} {'events us/rank/s':>17} {'rows us/rank/s':>15} "
        f"{'node 0, rows':>13} {'rows/events':>12}"
    )
    for world in (int(w) for w in args.ranks.split(",")):
        began = time.monotonic()
        # with --hang one node's ranks stop once the timed seconds are over: one simulation
        # serves both
        hang = Hang(node=world // PER_NODE // 2, second=WARM_UP_S + args.seconds + 1)
        if args.hang:
            total = hang.second + int(HANG_AFTER_S) + 1
            folder = pregenerate(cache, world, total, args.steps_per_s, hang)
        else:
            folder = pregenerate(cache, world, WARM_UP_S + args.seconds, args.steps_per_s)
        made = time.monotonic() - began
        runs: dict[str, list[float]] = {"events": [], "rows": []}
        profile = cProfile.Profile() if args.profile else None
        for i in range(args.pairs):
            order = ["events", "rows"] if i % 2 == 0 else ["rows", "events"]
            for name in order:
                runs[name].append(
                    cost_per_rank_s(
                        world, args.seconds, steps_per_s=args.steps_per_s, rows=name == "rows",
                        folder=folder, profile=profile if name == "rows" else None,
                    )
                )  # fmt: skip
        events, rows = (statistics.median(runs[k]) for k in ("events", "rows"))
        spread = {k: (min(v), max(v)) for k, v in runs.items()}
        core = rows * (world - PER_NODE) / 1e6
        print(
            f"{world:>6} {events:>7.1f} ({spread['events'][0]:.0f}-{spread['events'][1]:.0f})"
            f"{'':>2} {rows:>7.1f} ({spread['rows'][0]:.0f}-{spread['rows'][1]:.0f})"
            f" {100 * core:>11.1f}% {rows / events:>12.2f}"
            f"   (other nodes simulated in {made:.0f} s)",
            flush=True,
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)
        if args.hang:
            latency, right = hang_latency(world, folder, hang)
            said = "never" if latency is None else f"{latency:.2f} s"
            print(
                f"{world:>6} a node's ranks stop (hang_after {HANG_AFTER_S:g} s): node 0 names the "
                f"hang after {said}, culprits {'right' if right else 'WRONG'}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
