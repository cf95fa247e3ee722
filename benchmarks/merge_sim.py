"""The other nodes' launchers of benchmarks/merge_scale.py, their summaries made ahead of time.

Per simulated second each rank of nodes 1..N-1 writes its events (per step two gradient
buckets' collective_start and collective_end, then a step; a heartbeat with its progress facts
once a second; each rank with its own clock offset, timings, CPU and memory), each node's launcher
folds them into its own record of its ranks (a RunState, as on its own node) and makes its
summary with ddpdoctor's own Publisher. Both kinds of summary are made from the same events: with
rows (ddpdoctor now) and with every rank's events instead (the baseline, as before rows).

At 4096 nodes that takes far longer than node 0's side (the launchers of 4095 nodes, in one
process), so it is done once per size, untimed, in a child process (its records stay out of node
0's heap, where its garbage collector would walk them), each second's summaries written to a
cache folder. `Replay` then publishes a second as a launcher does, a new file renamed over the
node's summary (a hard link of the ready file, then os.replace): node 0's side reads exactly what
it reads from real launchers.

`Hang`: from one second on, one node's ranks stop progressing (blocked in their own code: the
same frame, no CPU; their heartbeats go on) and every other rank waits in the next step's first
all_reduce, which never ends: a hang whose culprits are that node's ranks.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.monitor.follow.node_publisher import Publisher
from ddpdoctor.monitor.model.snapshot import RunInfo
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.node_summary import SUMMARY_NAME
from ddpdoctor.protocol.rundir import RunDir

PER_NODE = 8
T0 = 1_700_000_000.0
VARIANTS = ("rows", "events")
WORKERS = 2  # child processes simulating the other nodes, each a share of them
_SOURCES = (
    "monitor/follow/node_publisher.py",
    "monitor/follow/rank_rows.py",
    "protocol/node_summary.py",
)


@dataclass(frozen=True)
class Hang:
    node: int  # whose ranks stop
    second: int  # the first simulated second they make no progress in


def ranks_of(node: int) -> range:
    return range(node * PER_NODE, (node + 1) * PER_NODE)


def _event(rank: int, kind: str, t: float, **fields) -> dict:
    return {"v": 1, "t": t, "mono": t - T0, "rank": rank, "kind": kind, **fields}


class Followers:
    """The launchers of nodes 1..N-1: each its own ranks' record and, per variant, publisher."""

    def __init__(
        self,
        world: int,
        steps_per_s: int = 1,
        hang: Hang | None = None,
        nodes: range | None = None,
    ) -> None:
        self.steps_per_s = steps_per_s
        self.hang = hang
        self.nodes = range(1, world // PER_NODE) if nodes is None else nodes
        info = RunInfo(name="merge-scale", run_dir="/nonexistent", world_size=world)
        run = RunDir(Path("/nonexistent"))  # (compose only: the texts go to the cache)
        self.publishers = {v: {n: Publisher(run, n) for n in self.nodes} for v in VARIANTS}
        for by_node in self.publishers.values():
            for publisher in by_node.values():
                publisher.host = f"sim-node-{publisher.node_rank}"
        self.states = {node: RunState(info) for node in self.nodes}
        self.lines: dict[int, int] = {}
        self.second = 0
        self.stuck_at: dict[int, int] = {}  # rank -> the step it stopped after
        for node in self.nodes:
            for rank in ranks_of(node):
                self._note(rank, "hello", T0, pid=10_000 + rank, ppid=9_000 + node,
                           host=f"sim-node-{node}", local_rank=rank % PER_NODE,
                           group_rank=node, world_size=world, backend="gloo")  # fmt: skip

    def _note(self, rank: int, kind: str, t: float, **fields) -> None:
        line = self.lines[rank] = self.lines.get(rank, 0) + 1
        event = _event(rank, kind, t, **fields)
        node = rank // PER_NODE
        self.states[node].apply(event)
        for by_node in self.publishers.values():
            by_node[node].note(rank, line, event)

    def second_of(self, rank: int, t: float) -> None:
        """One simulated second of one rank's events."""
        n = self.steps_per_s
        jitter = random.Random(rank * 100_003 + self.second)
        skew = jitter.uniform(0.0, 0.01)
        hang = self.hang
        if hang is not None and self.second >= hang.second:
            stopped = self.stuck_at.get(rank)
            if stopped is None:
                stopped = self.stuck_at[rank] = (self.second - 1) * n
                if rank // PER_NODE != hang.node:  # the others: into the next call, for good
                    seq = 2 * (stopped + 1)
                    self._note(rank, "collective_start", t + skew, op="all_reduce",
                               group="default", seq=seq, shapes=[[1000]],
                               dtypes=["float32"])  # fmt: skip
            self._note(rank, "heartbeat", t + skew + 0.93, step=stopped,
                       cpu_s=0.95 * hang.second, rss_bytes=2_000_000_000,
                       frame="train.py:42 wait")  # fmt: skip
            return
        for i in range(n):  # each step: two gradient buckets' all_reduce
            step = (self.second - 1) * n + i + 1
            at = t + skew + i / n * 0.9
            for bucket in (0, 1):
                seq = 2 * step + bucket
                self._note(rank, "collective_start", at, op="all_reduce", group="default",
                           seq=seq, shapes=[[1000]], dtypes=["float32"])  # fmt: skip
                self._note(rank, "collective_end", at + 0.01, op="all_reduce", group="default",
                           seq=seq, duration_s=jitter.uniform(0, 0.02), ok=True)  # fmt: skip
            self._note(rank, "step", at + 0.02, step=step,
                       step_time_s=jitter.uniform(0.95, 1.05) / n,
                       data_time_s=jitter.uniform(0.05, 0.15) / n,
                       compute_time_s=jitter.uniform(0.75, 0.85) / n,
                       comm_wait_s=jitter.uniform(0, 0.02))  # fmt: skip
        self._note(rank, "heartbeat", t + skew + 0.93, step=self.second * n,
                   cpu_s=0.95 * self.second + jitter.uniform(0, 0.01),
                   rss_bytes=2_000_000_000 + jitter.randrange(1 << 20),
                   frame=f"train.py:{self.second % 7} step")  # fmt: skip

    def summaries(self) -> tuple[float, dict[str, dict[int, str]]]:
        """The next second: (its time, variant -> node -> the summary's text)."""
        self.second += 1
        t = T0 + self.second
        texts: dict[str, dict[int, str]] = {v: {} for v in VARIANTS}
        # (the baseline is timed before any hang: its summaries end there)
        baseline = self.hang is None or self.second < self.hang.second
        for node in self.nodes:
            for rank in ranks_of(node):
                self.second_of(rank, t)
            own = ranks_of(node)
            trackers = self.states[node].ranks
            rows = self.publishers["rows"][node]
            texts["rows"][node] = rows.compose(t + 0.94, own, trackers=trackers)
            if baseline:
                events = self.publishers["events"][node]
                events.texts = dict(rows.texts)  # the same events: each encoded once, not twice
                texts["events"][node] = events.compose(t + 0.94, own)
        return t, texts


def cache_key(world: int, seconds: int, steps_per_s: int, hang: Hang | None) -> str:
    """A name for one size's summaries, and for the publisher's code that made them."""
    code = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent / "ddpdoctor"
    for rel in (*_SOURCES, "../benchmarks/merge_sim.py"):
        code.update((root / rel).read_bytes())
    said = f"{world}-{seconds}-{steps_per_s}-{hang.node if hang else 'x'}-{hang.second if hang else 'x'}"
    return f"{said}-{code.hexdigest()[:12]}"


def _generate(
    folder: Path, world: int, seconds: int, steps_per_s: int, hang: Hang | None, nodes: range
) -> None:
    followers = Followers(world, steps_per_s, hang, nodes)
    for second in range(1, seconds + 1):
        _, texts = followers.summaries()
        for variant, by_node in texts.items():
            where = folder / variant / str(second)
            where.mkdir(parents=True, exist_ok=True)
            for node, text in by_node.items():
                (where / f"node-{node}").write_text(text, encoding="utf-8")


def pregenerate(
    cache: Path, world: int, seconds: int, steps_per_s: int = 1, hang: Hang | None = None
) -> Path:
    """The folder of `seconds` simulated seconds of summaries, made now in child processes
    (WORKERS of them, each simulating a share of the nodes) unless `cache` has them already."""
    folder = cache / cache_key(world, seconds, steps_per_s, hang)
    if (folder / "times.json").exists():
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # (an earlier run stopped half way)
    context = multiprocessing.get_context("fork")
    nodes = range(1, world // PER_NODE)
    children = [
        context.Process(
            target=_generate, args=(folder, world, seconds, steps_per_s, hang, nodes[i::WORKERS])
        )
        for i in range(WORKERS)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"simulating the other nodes failed (exit {child.exitcode})")
    (folder / "times.json").write_text(json.dumps([T0 + s for s in range(1, seconds + 1)]))
    return folder


class Replay:
    """Publishes one variant's ready summaries into a run directory, a second at a time."""

    def __init__(self, run: RunDir, folder: Path, variant: str) -> None:
        self.run = run
        self.folder = folder / variant
        self.times = json.loads((folder / "times.json").read_text())
        self.second = 0

    def publish(self) -> float:
        self.second += 1
        ready = self.folder / str(self.second)
        for entry in os.scandir(ready):
            node = int(entry.name.removeprefix("node-"))
            target = self.run.node_dir(node)
            target.mkdir(parents=True, exist_ok=True)
            tmp = target / f".{SUMMARY_NAME}.replay"
            os.link(entry.path, tmp)
            os.replace(tmp, target / SUMMARY_NAME)
        return self.times[self.second - 1]

    @property
    def seconds(self) -> int:
        return len(self.times)
