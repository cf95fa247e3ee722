"""What a replica digest costs (ddpdoctor/runtime/replicas.py), per parameter count and per step.

    python benchmarks/replica_digest.py [--sizes 1e4,1e5,1e6,1e7] [--reps 30]
                                        [--rounds 20] [--block 64] [--hidden 512] [--device cpu]
                                        [--threads 1] [--replicas 1]

CPU threads: 1 by default, as torchrun sets OMP_NUM_THREADS=1 for each rank (a rank that uses
more shares the cores with its peers; on a loaded machine a parallel sum waits for its threads).

1. The digest alone, per model size: `digest_tensors` of an MLP's parameters (tensors of a few
   shapes, as a model has), `--reps` times after a warm-up; the median, the 10th and 90th
   percentiles in µs, and ns per parameter.

2. Its share of training time, measured the way the runtime pays it: a single-process gloo DDP
   model trains in blocks of `--block` steps, a plain block and a block that digests at the due
   steps the runtime's own schedule picks (`replicas._schedule`: K a power of two from the
   measured digest cost and step time, at most TARGET_FRACTION), interleaved in pairs within
   each of `--rounds` rounds (the order alternating), so that the machine's load drifts alike
   for both. Reported: the digest's accounted share (time inside the digest / time of the
   digesting blocks, the figure the 0.5 % budget is about), and the wall-time difference of the
   pair per round (median and spread: the sanity check, noisier than the share on a shared
   machine). `--replicas 2`: the rank digests two replicas of the same parameters, as a DDP
   model with torch's ZeroRedundancyOptimizer does (the model's digest and the optimizer's), each
   on its own schedule sharing the one budget (replica_sources.py); HSDP's digest is the same
   digest over the rank's shards, a fraction of the parameters.

On a GPU (`--device cuda`): the digest runs on the device where the parameters live; its one
copy to the host waits for the work queued before it, so the time measured around it includes
that wait (a synchronization the training would otherwise not make). Measure it the same way:
section 1 synchronizes before each timing and the `.tolist()` closes it; in section 2 the step
time includes the device work because the loss is read each step (`.item()`), as most loops do.
The schedule sizes K from that measured cost, so a GPU's larger relative cost yields a larger K.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("ddpdoctor") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(REPO))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def mlp(params: int, torch: Any, device: str) -> Any:
    """An MLP of about `params` parameters: width w, four layers."""
    width = max(4, int((params / 4) ** 0.5))
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def digest_cost(sizes: list[int], reps: int, device: str) -> None:
    import torch

    from ddpdoctor.runtime.replicas import digest_tensors

    print("1. the digest alone (µs: median [p10, p90]; ns per parameter at the median)")
    for size in sizes:
        params = list(mlp(size, torch, device).parameters())
        count = sum(p.numel() for p in params)
        digest_tensors(params)
        times = []
        for _ in range(reps):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            digest_tensors(params)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(
            f"   {count:>11,} parameters in {len(params)} tensors: {med * 1e6:9.1f} µs "
            f"[{_pct(times, 0.1) * 1e6:.1f}, {_pct(times, 0.9) * 1e6:.1f}]  "
            f"{med / count * 1e9:6.2f} ns/parameter"
        )


def training_share(rounds: int, block: int, hidden: int, device: str, count_of: int = 1) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.runtime import replicas

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(), torch.nn.Linear(hidden, 8),
    ).to(device)  # fmt: skip
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64, device=device), torch.randn(32, 8, device=device)
    params = [p for _, p in model.module.named_parameters()]
    states = [replicas.ModelState(model, i) for i in range(count_of)]
    replicas._STATES[:] = states  # the schedule shares the budget among the replicas digested
    state = states[0]
    step_no = 0
    digest_s = 0.0
    digest_cpu = 0.0  # the thread's CPU time inside digests: what preemption does not inflate
    digests = 0

    def steps(n: int, digest: bool) -> float:
        nonlocal step_no, digest_s, digest_cpu, digests
        t0 = time.perf_counter()
        for _ in range(n):
            for each in states if digest else ():
                if step_no < each.next_step:
                    continue
                d0, c0 = time.perf_counter(), time.thread_time()
                replicas.digest_tensors(params)
                cost = time.perf_counter() - d0
                digest_cpu += time.thread_time() - c0
                digest_s += cost
                digests += 1
                replicas._schedule(each, step_no, cost, time.perf_counter())
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
            step_no += 1
        return time.perf_counter() - t0

    steps(block, True)  # warm up, and learn the step time
    digest_s, digest_cpu, digests = 0.0, 0.0, 0  # the share is of the measured blocks only
    cpu0 = time.thread_time()
    diffs: list[float] = []
    digest_wall = 0.0
    plain_wall = 0.0
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        walls = {d: steps(block, d) for d in order}
        diffs.append((walls[True] - walls[False]) / walls[False])
        digest_wall += walls[True]
        plain_wall += walls[False]
    block_cpu = time.thread_time() - cpu0  # both kinds of blocks: about twice the digesting's
    count = sum(p.numel() for p in params)
    step_ms = plain_wall / (rounds * block) * 1e3
    print(
        f"2. training share: {count:,} parameters, {step_ms:.2f} ms a step, {rounds} rounds of "
        f"{block}-step pairs; {len(states)} replica(s) digested, K = {state.every} at the end, "
        f"{digests} digests"
    )
    print(
        f"   accounted: {digest_s / digest_wall * 100:.3f} % of the digesting blocks' time "
        f"(budget {replicas.TARGET_FRACTION * 100:.1f} %); "
        f"{digest_s / max(digests, 1) * 1e6:.1f} µs a digest; in CPU time (preemption left "
        f"out): {digest_cpu / max(block_cpu / 2, 1e-9) * 100:.3f} %, "
        f"{digest_cpu / max(digests, 1) * 1e6:.1f} µs a digest"
    )
    print(
        f"   pair difference: median {statistics.median(diffs) * 100:+.2f} % "
        f"[p10 {_pct(diffs, 0.1) * 100:+.2f} %, p90 {_pct(diffs, 0.9) * 100:+.2f} %] "
        "(wall time, digesting vs plain, per round)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1e4,1e5,1e6,1e7")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--replicas", type=int, default=1, help="replicas digested (2: DDP with ZeRO)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch's CPU threads (torchrun's default: 1)"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    digest_cost(sizes, args.reps, args.device)
    training_share(args.rounds, args.block, args.hidden, args.device, max(1, args.replicas))


if __name__ == "__main__":
    main()
