"""What the in-rank runtime executes per training step, counted in Python bytecodes.

    python benchmarks/runtime_bytecodes.py [--steps 1000] [--hidden 128]

runtime_hotpath.py times the runtime's cost, which a loaded machine hides (its steps swing by
hundreds of µs); this counts it, which no load changes: the loop and model of runtime_hotpath.py
with the runtime active as `ddpdoctor run` starts it by default, and a trace of every bytecode
executed in ddpdoctor's own code, per thread (the training thread, and the heartbeat thread that
encodes and writes the queued events), per function. Two passes:

    fast steps   steps queued for the heartbeat's flush (a real step of a few ms)
    slow steps   every step written as it closes (a step of 5 ms or more: core.SLOW_STEP_S)

Tracing makes every step slow, so each pass sets the runtime's step-write thresholds to what it
counts. The functions that run once a step count the same from run to run; what runs once a
second or so (the heartbeat's beat, DDP's timers, the gradient-sync count's write, the digests)
falls on more or fewer steps with the traced steps' speed, so the totals move by a few percent. C calls (clocks, locks, torch) are not counted: a bytecode is a unit of the interpreter's
work, not a time. To count another version of ddpdoctor, put it first on the path:
`PYTHONPATH=/elsewhere python benchmarks/runtime_bytecodes.py`.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runtime_hotpath as hotpath  # the loop and model of the hot-path benchmark

HEARTBEAT = "ddpdoctor-heartbeat"


class Counter:
    """Bytecodes and calls of ddpdoctor's functions, per (thread, function)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.on = False
        self.ops: collections.Counter[tuple[str, str]] = collections.Counter()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def trace(self, frame: Any, event: str, _arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not self.on or not filename.startswith(self.package):
            return None
        thread = "heartbeat" if threading.current_thread().name == HEARTBEAT else "training"
        key = (thread, f"{os.path.basename(filename)}:{frame.f_code.co_name}")
        self.calls[key] += 1
        frame.f_trace_opcodes = True
        ops = self.ops

        def local(_frame: Any, event: str, _arg: Any) -> Any:
            if event == "opcode":
                ops[key] += 1
            return local

        return local

    def per_thread(self, steps: int) -> dict[str, float]:
        totals: dict[str, float] = collections.defaultdict(float)
        for (thread, _), n in self.ops.items():
            totals[thread] += n / steps
        return totals


def count(steps: int, hidden: int, slow: bool) -> Counter:
    import ddpdoctor
    from ddpdoctor import runtime
    from ddpdoctor.runtime import core

    saved = core.SLOW_STEP_S, core.STEP_WRITE_EVERY_S
    core.SLOW_STEP_S = 0.0 if slow else float("inf")
    core.STEP_WRITE_EVERY_S = float("inf")
    counter = Counter(os.path.dirname(ddpdoctor.__file__))
    variant = hotpath.Variant("runtime", runtime=True)
    loader, sampler = hotpath.make_loader(16)
    data = hotpath.batches(loader, sampler)
    hotpath.build(variant, hidden)
    threading.settrace(counter.trace)  # the heartbeat thread, started by activate()
    try:
        with tempfile.TemporaryDirectory(prefix="ddpdoctor-bytecodes-") as tmp:
            rt = runtime.activate(Path(tmp) / "run")
            if rt is None:
                raise RuntimeError("the runtime did not activate")
            hotpath.train(variant, data, 300, record=False)  # warm-up; the first digests
            sys.settrace(counter.trace)
            counter.on = True
            for _ in range(steps // 50):
                hotpath.train(variant, data, 50, record=False)
                time.sleep(0.06)  # the heartbeat's flushes come as often as in a real loop
            rt.flush()
            counter.on = False
            sys.settrace(None)
            runtime.deactivate()
    finally:
        threading.settrace(None)
        core.SLOW_STEP_S, core.STEP_WRITE_EVERY_S = saved
    return counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--top", type=int, default=12, help="functions listed per pass")

    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import ddpdoctor

    torch.set_num_threads(1)
    os.environ["RANK"] = "0"
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    steps = max(50, args.steps // 50 * 50)
    print(f"ddpdoctor bytecodes per step ({ddpdoctor.__file__}), {steps} steps per pass")
    for slow in (False, True):
        counter = count(steps, args.hidden, slow)
        totals = counter.per_thread(steps)
        name = "slow steps (written as they close)" if slow else "fast steps (queued)"
        print(
            f"{name}: training thread {totals['training']:.0f}, heartbeat thread "
            f"{totals['heartbeat']:.0f}, total {sum(totals.values()):.0f}"
        )
        for (thread, where), n in counter.ops.most_common(args.top):
            calls = counter.calls[(thread, where)] / steps
            print(f"  {n / steps:7.1f} bytecodes {calls:6.2f} calls  {thread:9} {where}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
