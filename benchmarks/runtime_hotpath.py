"""What the in-rank runtime costs per training step, measured on its hot path in one process.

    python benchmarks/runtime_hotpath.py [--rounds 30] [--block 40] [--hidden 128] [--profile]
                                         [--log] [--sync] [--step-ms 4] [--capabilities]

A single-process gloo "world" trains the model of sample_jobs/healthy.py (32 -> hidden -> 4, a
DataLoader with a DistributedSampler, SGD), whose steps of a millisecond or two are the worst case
for a fixed per-step cost. Four variants run side by side, interleaved in blocks of `--block` steps
(the order rotates every round, so they share the machine's load alike), each on its own model:

    plain          DDP as torch ships it (its C++ all-reduce), no runtime
    comm hook      torch's Python allreduce comm hook registered, no runtime
    runtime        the runtime as `ddpdoctor run` starts it by default: steps, data waits,
                   phases; DDP keeps its C++ all-reduce, whose buckets the flight recorder
                   holds (read only when the monitor asks: nothing per step)
    runtime, --ddp-buckets  the runtime with DDPDOCTOR_DDP_BUCKETS=1 (every gradient bucket
                   recorded as events by a Python comm hook)

`--capabilities` adds one variant per capability of the default runtime, each with that one
switched off, so that its cost reads as the default's figure minus that variant's:

    no sync count       DDP's gradient syncs not counted (the mismatch rule's count per forward)
    slow steps queued   a step of 5 ms or more queued like a fast one, not written as it closes
                        (what a rank SIGKILLed right after a slow step has on disk)
    no DDP timers       DDP's C++ timers not sampled nor read (the comm_wait_s of each step)
    no digests          replica digests off (DDPDOCTOR_REPLICAS=0): the due-step check and digests

The replica digests' own time (their `cost_s`, budgeted apart at 0.5 % of the step time: see
replica_digest.py) is also read from the default variant's events and printed per step.

Reported per variant, in µs per step: the wall time of a step (the mean over a block: a flush
of the writer thread lands on a few steps, and a median step would hide it), the CPU time of the
whole process (all threads: the runtime's heartbeat / writer thread counts) and of the training
thread alone, each with its difference to plain and to the comm hook (the median over rounds of
the difference within a round, which cancels the drift of a shared machine's load). The default
runtime's line adds a 95 % interval of that median: one round's difference swings by a hundred
µs or more on a shared machine, so 30 rounds resolve about ±15 µs and a target of that size
needs a few hundred (`--rounds 300`, about four minutes). `--profile`
adds a cProfile of the runtime's own functions on the fully active variant (call counts per
step, and where the time goes).

`--log` adds a `ddpdoctor.log(loss=...)` per step (the reference job logs every step), `--sync` an
all_reduce of the loss (a collective of the script's own, written to disk before it is entered).

Under torchrun (`torchrun --nproc-per-node 2 benchmarks/runtime_hotpath.py`) the same runs in a
real 2-rank gloo world (rank 0 reports): what the variants cost where ranks wait for each other
and gloo's threads compete with the training threads for the cores, as in overhead.py, but
interleaved in blocks within one process, so that the load of a shared machine cancels out.

To compare two versions of ddpdoctor, put the other one first on the path:
`PYTHONPATH=/elsewhere python benchmarks/runtime_hotpath.py` runs /elsewhere/ddpdoctor.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("ddpdoctor") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(REPO))


SETTLE_STEPS = 5
# After a switch of the runtime on (or off), train untimed for at least this long: a new heartbeat
# thread beats at once and writes the first events ~20 ms after they are queued (heartbeat.py),
# costs a real run pays once at its start, but each round here, which in 5 steps of a fraction of
# a millisecond landed in the timed block (~100-200 µs in a 20 ms block: +5-10 µs a step).
SETTLE_S = 0.15


@dataclass
class Variant:
    name: str
    runtime: bool  # the runtime is active while this variant trains
    buckets: bool = False  # DDPDOCTOR_DDP_BUCKETS=1 (--ddp-buckets)
    comm_hook: bool = False  # torch's Python allreduce hook, registered by hand
    off: str = ""  # the capability switched off (--capabilities): a key of CAPABILITIES
    model: Any = None
    optimizer: Any = None
    # per timed block (one per round), in µs per step: its wall time (the mean: a flush of the
    # writer thread lands on a few steps, and the median step would hide it), the CPU time of
    # the whole process (every thread) and of the training thread alone
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    thread_cpu: list[float] = field(default_factory=list)
    steps: int = 0


def _no_sync_count(on: bool) -> None:
    from ddpdoctor.runtime import ddp_contract

    if on:  # read once, when the runtime installs its DDP hooks
        ORIGINAL["counts_syncs"] = ddp_contract.counts_syncs
        ddp_contract.counts_syncs = lambda _rt: False
    else:
        ddp_contract.counts_syncs = ORIGINAL.pop("counts_syncs")


def _slow_steps_queued(on: bool) -> None:
    from ddpdoctor.runtime import core

    if on:
        ORIGINAL["SLOW_STEP_S"] = core.SLOW_STEP_S
        core.SLOW_STEP_S = float("inf")
    else:
        core.SLOW_STEP_S = ORIGINAL.pop("SLOW_STEP_S")


def _no_ddp_timers(on: bool) -> None:
    from ddpdoctor.runtime import ddp_hooks

    def no_probe(ddp: Any, *_: Any) -> bool:
        setattr(ddp, ddp_hooks.PROBE_ATTR, False)
        return False

    if on:
        ORIGINAL["start_probe"] = ddp_hooks.start_probe
        ddp_hooks.start_probe = no_probe
    else:
        ddp_hooks.start_probe = ORIGINAL.pop("start_probe")


def _no_digests(on: bool) -> None:
    if on:
        os.environ["DDPDOCTOR_REPLICAS"] = "0"
    else:
        os.environ.pop("DDPDOCTOR_REPLICAS", None)


# --capabilities: variant name -> what switches its capability off (True) and back on (False)
ORIGINAL: dict[str, Any] = {}
CAPABILITIES = {
    "no sync count": _no_sync_count,
    "slow steps queued": _slow_steps_queued,
    "no DDP timers": _no_ddp_timers,
    "no digests": _no_digests,
}


def world() -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, else a single-process world."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def make_loader(batch_size: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(dim=1)
    data = TensorDataset(x, y)
    rank, size = world()
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=batch_size, sampler=sampler), sampler


def batches(loader: Any, sampler: Any) -> Iterator[Any]:
    """Endless batches; every pass over the loader is a new epoch (set_epoch, as jobs do)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def build(variant: Variant, hidden: int) -> None:
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 4)))
    if variant.comm_hook:
        model.register_comm_hook(None, allreduce_hook)
    variant.model = model
    variant.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)


# What every step does besides training (--log, --sync): set by main().
LOG_EVERY_STEP = False
SYNC_EVERY_STEP = False


def train(variant: Variant, data: Iterator[Any], steps: int, record: bool = True) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F

    import ddpdoctor

    model, optimizer = variant.model, variant.optimizer
    cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    for _ in range(steps):
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if SYNC_EVERY_STEP:  # a blocking collective of the script's own (written at once)
            dist.all_reduce(loss.detach())
        if LOG_EVERY_STEP:  # a no-op without the runtime
            ddpdoctor.log(loss=loss.item())
    if record:
        variant.wall.append((time.perf_counter() - wall0) / steps * 1e6)
        variant.cpu.append((time.process_time() - cpu0) / steps * 1e6)
        variant.thread_cpu.append((time.thread_time() - thread0) / steps * 1e6)
        variant.steps += steps


def settle_steps(variant: Variant, data: Iterator[Any]) -> int:
    """How many untimed steps after a switch cover SETTLE_S (at least SETTLE_STEPS), from the
    time of a few steps now; the same number on every rank (they step together)."""
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    train(variant, data, 20, record=False)
    per_step = (time.perf_counter() - start) / 20
    wanted = torch.tensor([max(SETTLE_STEPS, int(SETTLE_S / max(per_step, 1e-6)) + 1)])
    if dist.get_world_size() > 1:
        dist.all_reduce(wanted, op=dist.ReduceOp.MAX)
    return int(wanted.item())


class Session:
    """Turns the runtime on and off between blocks (each activation appends to the same file)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.current: tuple[bool, bool, str] | None = None

    def run_dir_of(self, variant: Variant) -> Path:
        name = "buckets" if variant.buckets else "default"
        return self.run_dir / (name + variant.off.replace(" ", "-"))

    def enter(self, variant: Variant) -> bool:
        """Switch the runtime as the variant wants it; True when something changed."""
        from ddpdoctor import runtime

        wanted = (variant.runtime, variant.buckets, variant.off)
        if self.current == wanted:
            return False
        runtime.deactivate()
        if self.current is not None and self.current[2]:
            CAPABILITIES[self.current[2]](False)
        if variant.off:
            CAPABILITIES[variant.off](True)
        if variant.runtime:
            if variant.buckets:
                os.environ["DDPDOCTOR_DDP_BUCKETS"] = "1"
            else:  # the default: the flight recorder
                os.environ.pop("DDPDOCTOR_DDP_BUCKETS", None)
            if runtime.activate(self.run_dir_of(variant)) is None:
                raise RuntimeError("the runtime did not activate")
        self.current = wanted
        return True

    def leave(self) -> None:
        from ddpdoctor import runtime

        runtime.deactivate()
        if self.current is not None and self.current[2]:
            CAPABILITIES[self.current[2]](False)
        self.current = None


def paired(v: Variant, ref: Variant, metric: str) -> float:
    """The median over rounds of v's figure minus ref's in the same round (the load drifts
    between rounds; within one, the variants ran back to back)."""
    return statistics.median(differences(v, ref, metric))


def differences(v: Variant, ref: Variant, metric: str) -> list[float]:
    """v's figure minus ref's, round by round, smallest first."""
    return sorted(a - b for a, b in zip(getattr(v, metric), getattr(ref, metric), strict=True))


def report(variants: list[Variant], step_ms: float) -> dict[str, Any]:
    by_name = {v.name: v for v in variants}
    plain, hook, full = by_name["plain"], by_name["comm hook"], by_name["runtime"]
    metrics = (
        ("wall", "wall µs/step"),
        ("cpu", "CPU µs/step, process"),
        ("thread_cpu", "training thread"),
    )
    header = "".join(f"{title:>27}" for _, title in metrics)
    print(f"{'':22}{header}")
    print(f"{'variant':22}" + f"{'median':>11}{'vs plain':>9}{'vs hook':>8}" * len(metrics))
    result: dict[str, Any] = {}
    for v in variants:
        row = f"{v.name:22}"
        result[v.name] = {}
        for metric, _ in metrics:
            value = statistics.median(getattr(v, metric))
            vs_plain, vs_hook = paired(v, plain, metric), paired(v, hook, metric)
            row += f"{value:11.0f}{vs_plain:+9.0f}{vs_hook:+8.0f}"
            result[v.name][metric] = {"median": value, "vs_plain": vs_plain, "vs_hook": vs_hook}
        print(row)
    extra = paired(full, plain, "wall")
    buckets = by_name["runtime, --ddp-buckets"]
    extra_buckets = paired(buckets, plain, "wall")
    low, high = spread(full, plain, "wall")
    wall_ci, cpu_ci = median_interval(full, plain, "wall"), median_interval(full, plain, "cpu")
    print(
        f"runtime (default, flight recorder): {extra:+.1f} µs/step over plain DDP "
        f"(rounds {low:+.0f} .. {high:+.0f}; 95% interval of the median {wall_ci}) = "
        f"{100 * extra / (step_ms * 1000):.2f}% of a {step_ms:g} ms step; "
        f"CPU {paired(full, plain, 'cpu'):+.1f} µs/step ({cpu_ci})"
    )
    print(
        f"runtime with --ddp-buckets: {extra_buckets:+.0f} µs/step over plain DDP, "
        f"{paired(buckets, hook, 'wall'):+.0f} µs/step over torch's Python comm hook"
    )
    return result


def median_interval(v: Variant, ref: Variant, metric: str) -> str:
    """A 95 % confidence interval of the median per-round difference, free of any assumption on
    the rounds' distribution (a shared machine's is skewed): the order statistics k and n-k+1 of
    the sorted differences, k from the binomial(n, 1/2) normal approximation. Whether a figure
    meets a target is read from this, not from the median alone."""
    diffs = differences(v, ref, metric)
    n = len(diffs)
    k = int((n - 1.96 * n**0.5) / 2)  # 0-based index of the lower bound
    if k < 1:
        return "too few rounds for an interval"
    return f"{diffs[k - 1]:+.1f} .. {diffs[n - k]:+.1f}"


def spread(v: Variant, ref: Variant, metric: str) -> tuple[float, float]:
    """The interquartile range of the per-round differences (how far one round can be off)."""
    diffs = differences(v, ref, metric)
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
    return quartiles[0], quartiles[2]


def events_per_step(run_dir: Path, steps: int) -> tuple[str, float]:
    """The events written per step, by kind, and the replica digests' own time per step (µs)."""
    import collections
    import json

    path = run_dir / "events" / f"rank-{world()[0]}.jsonl"
    counts: collections.Counter[str] = collections.Counter()
    digests_s = 0.0
    for line in path.read_bytes().splitlines():
        try:
            event = json.loads(line)
            counts[event["kind"]] += 1
        except (ValueError, KeyError):
            continue
        if event["kind"] == "replica_digest":
            digests_s += float(event.get("cost_s") or 0.0)
    text = ", ".join(f"{k} {n / steps:.2f}" for k, n in sorted(counts.items()))
    return text, digests_s / steps * 1e6


def capability_costs(variants: list[Variant]) -> None:
    """Each capability's cost: the default runtime's figure minus its variant without it."""
    full = next(v for v in variants if v.runtime and not v.buckets and not v.off)
    print("\ncost per capability (the default runtime minus the variant without it; median of")
    print("the per-round differences, interquartile range in brackets), µs/step:")
    for v in variants:
        if not v.off:
            continue
        row = f"  {v.name:22}"
        for metric in ("wall", "cpu", "thread_cpu"):
            diffs = sorted(
                a - b for a, b in zip(getattr(full, metric), getattr(v, metric), strict=True)
            )
            quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else diffs * 3
            row += f"  {metric} {quartiles[1]:+6.0f} [{quartiles[0]:+.0f}, {quartiles[2]:+.0f}]"
        print(row)


def profile(variant: Variant, session: Session, data: Iterator[Any], steps: int) -> None:
    session.enter(variant)
    train(variant, data, 50, record=False)
    profiler = cProfile.Profile()
    profiler.enable()
    train(variant, data, steps, record=False)
    profiler.disable()
    session.leave()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():
        if "ddpdoctor" in filename or "default_hooks" in filename:
            where = f"{Path(filename).name}:{line}({name})"
            rows.append((tottime, cumtime, calls, where))
    rows.sort(reverse=True)
    print(f"\ncProfile of the runtime's functions ({steps} steps; times inflated by the profiler)")
    print(f"{'calls/step':>10} {'own µs/step':>12} {'cum µs/step':>12}  function")
    for tottime, cumtime, calls, where in rows[:25]:
        print(
            f"{calls / steps:10.2f} {tottime / steps * 1e6:12.1f} {cumtime / steps * 1e6:12.1f}  "
            f"{where}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds of blocks per variant")
    parser.add_argument("--block", type=int, default=40, help="steps per block")
    parser.add_argument("--hidden", type=int, default=128, help="hidden width of the model")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="cProfile the runtime's functions")
    parser.add_argument(
        "--log", action="store_true", help="every variant calls ddpdoctor.log(loss=...) each step"
    )
    parser.add_argument(
        "--sync", action="store_true", help="every variant all-reduces its loss each step"
    )
    parser.add_argument(
        "--step-ms", type=float, default=4.0, help="the step time the overhead is judged against"
    )
    parser.add_argument(
        "--capabilities",
        action="store_true",
        help="add a variant per capability switched off, and print what each costs",
    )
    args = parser.parse_args(argv)
    global LOG_EVERY_STEP, SYNC_EVERY_STEP
    LOG_EVERY_STEP, SYNC_EVERY_STEP = args.log, args.sync

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun gives each rank
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ:  # under torchrun: every rank runs the same blocks in turn
        dist.init_process_group("gloo")
    else:
        os.environ["RANK"] = "0"
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    rank, size = world()
    if rank != 0:  # only rank 0 reports
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    variants = [
        Variant("plain", runtime=False),
        Variant("comm hook", runtime=False, comm_hook=True),
        Variant("runtime, --ddp-buckets", runtime=True, buckets=True),
        Variant("runtime", runtime=True),
    ]
    if args.capabilities:  # before the default runtime: it stays the last variant
        variants[-1:-1] = [Variant(name, runtime=True, off=name) for name in CAPABILITIES]
    loader, sampler = make_loader(args.batch_size)
    data = batches(loader, sampler)
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-hotpath-") as tmp:
        session = Session(Path(tmp) / "run")
        for v in variants:
            build(v, args.hidden)
            session.enter(v)
            train(v, data, 30, record=False)  # warm-up: first-call costs, hook registration
        settle = settle_steps(variants[-1], data)  # the runtime is on: its variant
        extras = "".join(
            f", {what} every step"
            for flag, what in ((args.log, "log()"), (args.sync, "all_reduce"))
            if flag
        )
        print(
            f"runtime hot path: {size} rank(s), {args.rounds} rounds x {args.block} steps per "
            "variant, "
            f"hidden {args.hidden}, batch {args.batch_size}{extras}, torch {torch.__version__}"
        )
        settled = 0
        for r in range(args.rounds):
            shift = r % len(variants)
            for v in variants[shift:] + variants[:shift]:
                if session.enter(v):
                    # not timed: what a switch costs (the new heartbeat thread's first beat, the
                    # hello events), which a real run pays once
                    train(v, data, settle, record=False)
                    if v is variants[-1]:  # the variant whose events are counted below
                        settled += settle
                train(v, data, args.block)
        session.leave()
        report(variants, args.step_ms)
        full = variants[-1]
        untimed = 30 + 20 + settled  # warm-up and settling steps write events too
        per_step, digests_us = events_per_step(session.run_dir_of(full), full.steps + untimed)
        print(f"events per step of the full runtime: {per_step}")
        print(
            f"of the runtime's figure, replica digests themselves (their cost_s): "
            f"{digests_us:.1f} µs/step (budgeted apart: 0.5 % of the step time at most)"
        )
        if args.capabilities:
            capability_costs(variants)
        if args.profile:
            profile(variants[-1], session, data, 500)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
