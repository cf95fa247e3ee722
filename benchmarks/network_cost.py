"""What the network checks cost a healthy job: node 0's launcher of a 2-node job with 8 ranks
on this node, its ranks training (a step and a heartbeat per rank between polls), polled as the
launcher polls. Each round runs one poll with the network side as shipped and two with it
switched off (no looks, no reads of the nodes' looks, no lookups of names), in alternating
order; the ratio of their CPU times (process CPU: the network side's threads included) is
printed as median and spread over the rounds, beside the two polls without it against each
other (the machine's noise), with the looks taken and the probes sent (both
must be 0: they run only after every rank of a node stalled past the threshold).

    python benchmarks/network_cost.py [--pairs 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow import peer_probe
from ddpdoctor.protocol.rundir import RunDir

RANKS = 8


def write_run(run: RunDir) -> None:
    run.run_json.write_text(json.dumps({"world_size": RANKS * 2, "backend": "gloo", "nnodes": 2}))
    now = time.time()
    for rank in range(RANKS):
        hello = {"v": 1, "t": now, "mono": 0.0, "rank": rank, "kind": "hello", "local_rank": rank,
                 "world_size": RANKS * 2, "host": os.uname().nodename, "pid": os.getpid(),
                 "backend": "gloo"}  # fmt: skip
        with open(run.events_file(rank), "w") as fh:
            fh.write(json.dumps(hello) + "\n")


def advance(run: RunDir, step: int) -> None:
    t = time.time()
    for rank in range(RANKS):
        with open(run.events_file(rank), "a") as fh:
            for kind, extra in (("step", {"step": step, "step_time_s": 0.1}), ("heartbeat", {})):
                line = {"v": 1, "t": t, "mono": t, "rank": rank, "kind": kind, **extra}
                fh.write(json.dumps(line) + "\n")


class Off:
    """The network side switched off."""

    watch = None

    def observe(self, *args) -> None:
        pass

    def read(self, *args) -> tuple:
        return ()

    def findings(self, *args) -> list:
        return []

    def wait(self, timeout_s: float) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=300, help="rounds of three polls")
    args = parser.parse_args()
    probes = []
    real_probe_all = peer_probe.probe_all
    peer_probe.probe_all = lambda targets, *a, **k: (
        probes.extend(targets) or real_probe_all(targets, *a, **k)
    )
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(Path(tmp) / "run")
        write_run(run)
        monitor = Monitor(
            run,
            capture_stacks=False,
            explain_logs=False,
            node_rank=0,
            hang_after=5.0,
            launcher=True,
        )
        on, off = monitor.network, Off()
        step = 0
        for _ in range(20):  # warm up: every rank read and running
            step += 1
            advance(run, step)
            monitor.poll()
        ratios, control, on_us, off_us = [], [], [], []
        orders = (("on", "off", "off2"), ("off", "off2", "on"), ("off2", "on", "off"))
        for i in range(args.pairs):
            times = {}
            for side in orders[i % 3]:
                monitor.network = on if side == "on" else off
                step += 1
                advance(run, step)
                start = time.process_time()
                monitor.poll()
                times[side] = time.process_time() - start
            ratios.append(times["on"] / times["off"])
            control.append(times["off2"] / times["off"])  # the same poll twice: the noise
            on_us.append(times["on"] * 1e6)
            off_us.append(times["off"] * 1e6)
        monitor.network = on
        snap = monitor.poll()
        own = monitor.own_ranks(snap)
        nodes = {0, 1}
        start = time.perf_counter()
        for _ in range(2000):  # what the network side adds to one poll, alone
            on.read(snap, nodes, snap.taken_t)
            on.findings(snap)
            on.observe(snap, own, snap.taken_t)
        side_us = (time.perf_counter() - start) / 2000 * 1e6
        states = Counter(v.state.value for v in monitor.poll().ranks)
        looks = on.watch.looks if on.watch is not None else 0
        names = on.watch._names if on.watch is not None else []
        start = time.perf_counter()
        for _ in range(100):
            on.watch._name_views() if on.watch is not None else None
        names_us = (time.perf_counter() - start) / 100 * 1e6
    q = statistics.quantiles(ratios, n=10)
    c = statistics.quantiles(control, n=10)
    shown = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    print(f"ranks: {shown} (node 1's 8 are not written here), pairs: {args.pairs}")
    print(f"poll CPU with the network side: median {statistics.median(on_us):.0f} us")
    print(f"poll CPU without it:            median {statistics.median(off_us):.0f} us")
    print(
        f"ratio with/without: median {statistics.median(ratios):.3f} "
        f"(p10 {q[0]:.3f}, p90 {q[-1]:.3f})"
    )
    print(
        f"control, without against without: median {statistics.median(control):.3f} "
        f"(p10 {c[0]:.3f}, p90 {c[-1]:.3f})"
    )
    print(f"the network side alone, per poll: {side_us:.1f} us")
    print(f"looks at the sockets: {looks}; peer probes sent: {len(probes)}")
    print(
        f"the names' check ({', '.join(n for n, _ in names)}), every 15 s in a thread: "
        f"{names_us:.0f} us each"
    )


if __name__ == "__main__":
    main()
