"""The runtime's own CPU time per training step, measured inside the loop, call by call.

    python benchmarks/runtime_own.py [--steps 3000] [--hidden 128] [--repeats 3]

runtime_hotpath.py compares whole steps with and without the runtime: on a shared 2-core machine
the steps' own CPU time swings by hundreds of µs from block to block (other processes evict the
caches), which hides a difference of 15 µs however the blocks are interleaved. This script
measures only what the runtime adds, where it runs: the training loop of runtime_hotpath.py (the
model of sample_jobs/healthy.py, a DataLoader, SGD) with the runtime active as `ddpdoctor run`
starts it by default, and around each of its entry points on the training thread a clock of the
thread's CPU time, before and after, and around the call it wraps:

    data        the DataLoader `__next__` wrapper, less the fetch it wraps
    forward     DDP's forward wrapper (the SPMD contract and the gradient-sync count, the
                steps, the replica digests' due-step check, DDP's timers), less DDP's forward
    optimizer   torch's optimizer step post-hook (marks the step trained; replica citations)
    writer      the heartbeat thread's CPU (flushes of queued events, the beat once a second)

A step's close (and its write, when the step is slow) happens in whichever of `data` and
`forward` closes it. The replica digests run inside `forward` at their due steps; their own time
(the CPU of the calls that took them; budgeted apart at 0.5 % of the step time) is printed apart
and left out of the total. The clocks' own cost is measured the same way around an empty call and
subtracted. Medians of the repeats; each repeat's figure in brackets.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runtime_hotpath as hotpath  # the loop and model of the hot-path benchmark

clock = time.thread_time


class Timed:
    """CPU time spent in an entry point, less the time of the call it wraps."""

    def __init__(self) -> None:
        self.own = 0.0
        self.calls = 0
        self._inner = 0.0

    def outer(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._inner = 0.0
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.own += clock() - t0 - self._inner
                self.calls += 1

        return timed

    def inner(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self._inner += clock() - t0

        return timed


def cell_of(fn: Any, name: str) -> Any:
    """The closure variable `name` of `fn` (what a wrapper calls: its original)."""
    return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents


def set_cell(fn: Any, name: str, value: Any) -> None:
    fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents = value


def instrument() -> tuple[dict[str, Timed], Callable[[], None]]:
    """Clocks around the runtime's entry points; returns them and what takes them off."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim import optimizer as torch_optimizer
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from ddpdoctor.runtime import replicas

    timers = {name: Timed() for name in ("data", "forward", "optimizer", "clocks", "digests")}
    undo: list[Callable[[], None]] = []
    due = replicas.due  # a digest, at its due step (inside the forward wrapper)
    replicas.due = timers["digests"].outer(due)
    undo.append(lambda: setattr(replicas, "due", due))
    data_wrapper = _BaseDataLoaderIter.__next__
    fetch = cell_of(data_wrapper, "original_next")
    set_cell(data_wrapper, "original_next", timers["data"].inner(fetch))
    _BaseDataLoaderIter.__next__ = timers["data"].outer(data_wrapper)  # type: ignore[method-assign]
    undo.append(lambda: setattr(_BaseDataLoaderIter, "__next__", data_wrapper))
    undo.append(lambda: set_cell(data_wrapper, "original_next", fetch))
    # ddpdoctor's wrapper (one; older versions stacked two), around DDP's own forward
    outer = holder = innermost = DDP.forward
    while "original_forward" in getattr(getattr(innermost, "__code__", None), "co_freevars", ()):
        holder, innermost = innermost, cell_of(innermost, "original_forward")
    if holder is innermost:
        raise RuntimeError("the runtime's DDP forward wrappers are not installed")
    set_cell(holder, "original_forward", timers["forward"].inner(innermost))
    DDP.forward = timers["forward"].outer(outer)  # type: ignore[method-assign]
    undo.append(lambda: setattr(DDP, "forward", outer))
    undo.append(lambda: set_cell(holder, "original_forward", innermost))
    hooks = torch_optimizer._global_optimizer_post_hooks
    for key, hook in list(hooks.items()):
        hooks[key] = timers["optimizer"].outer(hook)
        undo.append(functools.partial(hooks.__setitem__, key, hook))

    def remove() -> None:
        for fn in reversed(undo):
            fn()

    return timers, remove


def heartbeat_cpu() -> float:
    """CPU seconds of the runtime's heartbeat (writer) thread so far."""
    for thread in threading.enumerate():
        if thread.name == "ddpdoctor-heartbeat" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def one_repeat(steps: int, hidden: int, run_dir: Path, off: str = "") -> dict[str, float]:
    """One run of `steps` timed steps, with the capability `off` switched off (none: "")."""
    if off:
        hotpath.CAPABILITIES[off](True)
    try:
        return _one_repeat(steps, hidden, run_dir)
    finally:
        if off:
            hotpath.CAPABILITIES[off](False)


def _one_repeat(steps: int, hidden: int, run_dir: Path) -> dict[str, float]:
    from ddpdoctor import runtime

    variant = hotpath.Variant("runtime", runtime=True)
    loader, sampler = hotpath.make_loader(16)
    data = hotpath.batches(loader, sampler)
    hotpath.build(variant, hidden)
    rt = runtime.activate(run_dir)
    if rt is None:
        raise RuntimeError("the runtime did not activate")
    try:
        hotpath.train(variant, data, 200, record=False)  # warm-up; the first digests
        timers, remove = instrument()
        empty = timers["clocks"].outer(timers["clocks"].inner(lambda: None))
        writer0, wall0 = heartbeat_cpu(), time.perf_counter()
        for _ in range(steps // 50):
            hotpath.train(variant, data, 50, record=False)
            for _ in range(3):  # the clocks' cost, measured in the same cold caches
                empty()
        writer_s = heartbeat_cpu() - writer0
        wall = time.perf_counter() - wall0
        remove()
    finally:
        runtime.deactivate()
    done = steps // 50 * 50
    clocks = timers["clocks"].own / max(1, timers["clocks"].calls)
    digests = timers["digests"]
    digests_s = digests.own - clocks * digests.calls
    result = {"wall per step": wall / done * 1e6}
    for name in ("data", "forward", "optimizer"):
        timer = timers[name]
        result[name] = (timer.own - clocks * timer.calls) / done * 1e6
    result["forward"] -= digests_s / done * 1e6
    result["writer"] = writer_s / done * 1e6
    result["total"] = sum(result[k] for k in ("data", "forward", "optimizer", "writer"))
    result["digests (apart)"] = digests_s / done * 1e6
    result["clock pair (subtracted)"] = clocks * 1e6
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--capabilities",
        action="store_true",
        help="also run with each capability of runtime_hotpath.py --capabilities switched off, "
        "interleaved with the default in every repeat",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("DDPDOCTOR_DDP_BUCKETS", None)  # the default: the flight recorder
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["RANK"] = "0"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    variants = [""] + (list(hotpath.CAPABILITIES) if args.capabilities else [])
    runs: dict[str, list[dict[str, float]]] = {off: [] for off in variants}
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-own-") as tmp:
        for i in range(args.repeats):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for off in order:
                run_dir = Path(tmp) / f"run{i}{off.replace(' ', '-')}"
                runs[off].append(one_repeat(args.steps, args.hidden, run_dir, off))
    dist.destroy_process_group()
    results = runs[""]
    print(
        f"the runtime's own CPU time per step, {args.repeats} x {args.steps} steps, "
        f"hidden {args.hidden}, torch {torch.__version__}, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    for key in results[0]:
        values = [r[key] for r in results]
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {key:24} {statistics.median(values):8.1f} µs  [{each}]")
    for off in variants[1:]:
        # the capability's cost: the default's total less the total without it, repeat by repeat
        diffs = [a["total"] - b["total"] for a, b in zip(results, runs[off], strict=True)]
        each = ", ".join(f"{d:+.1f}" for d in diffs)
        print(f"  cost of {off!r:22} {statistics.median(diffs):+8.1f} µs  [{each}] ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
