"""What comparing the SPMD contract costs, once per model, against one training step of it.

    python benchmarks/fingerprint.py [--params 1000] [--ranks 2] [--pairs 15]

At a model's first forward every rank builds its contract (one entry per parameter: name, shape,
dtype, requires_grad; ddpdoctor/runtime/fingerprint.py) and writes it to the job's store; the
last rank to arrive reads every rank's digest and, only when they differ, the contracts of one
rank per digest. This runs that on a real TCPStore on loopback (this process the server, every
rank a client of it, the last one timed: it pays the reads and the comparison), for a model of
`--params` parameters (Linear layers of 2 parameters each), in interleaved pairs with one
training step of the same model (forward, backward, SGD step) as the baseline, and prints the
median and spread (interquartile range) of each and their ratio, and the timed rank's own CPU
time (a loaded machine's other processes do not count there). Two cases: the contracts agree
(every healthy job), and the last rank's differs in one frozen parameter (the diff is made).
Target: 50 ms for 1,000 parameters.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("ddpdoctor") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from ddpdoctor.runtime import fingerprint  # noqa: E402

CPU: list[float] = []  # the timed rank's own CPU time per comparison (its thread)


def model_of(params: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(8, 8) for _ in range(max(1, params // 2))))


def contract(model: nn.Module) -> list[fingerprint.Entry]:
    where = (__file__, 1, "main")
    return fingerprint.param_entries(model.named_parameters(), lambda _name: where)


def compare_once(
    stores: list[dist.Store], model: nn.Module, label: str, *, differ: bool
) -> tuple[float, str | None]:
    """Every rank but the last publishes (untimed); the last builds its contract and compares."""
    world = len(stores)
    for rank in range(world - 1):
        fingerprint.exchange_on(
            stores[rank], rank, range(world), label, "model", contract(model), 0.0
        )
    if differ:
        first = next(iter(model.parameters()))
        first.requires_grad_(False)
    t0, c0 = time.perf_counter(), time.thread_time()
    message = fingerprint.exchange_on(
        stores[-1], world - 1, range(world), label, "model", contract(model), 0.0
    )
    elapsed = time.perf_counter() - t0
    CPU.append(time.thread_time() - c0)
    if differ:
        first.requires_grad_(True)
    return elapsed, message


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - t0


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) >= 4 else [min(values), 0, max(values)]
    return f"median {statistics.median(values) * 1000:7.2f} ms  IQR {q[0] * 1000:.2f}-{q[2] * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    port = server.port
    stores: list[dist.Store] = [
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        for _ in range(args.ranks)
    ]
    model = model_of(args.params)
    count = sum(1 for _ in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 8)
    train_step(model, opt, x)  # warm up
    print(f"contract of {count} parameters, {args.ranks} ranks, {args.pairs} interleaved pairs")
    for differ in (False, True):
        base: list[float] = []
        cost: list[float] = []
        message = None
        for i in range(args.pairs):
            base.append(train_step(model, opt, x))
            elapsed, message = compare_once(stores, model, f"b{int(differ)}-{i}", differ=differ)
            cost.append(elapsed)
        case = "contracts differ" if differ else "contracts agree "
        ratio = statistics.median(cost) / statistics.median(base)
        print(f"{case}: compare {spread(cost)}  (its own CPU {spread(CPU)})")
        CPU.clear()
        print(f"{'':18}step    {spread(base)}  ratio {ratio:.2f}x one step")
        assert (message is not None) == differ, message
    print("target: 50 ms for 1,000 parameters (once per model)")


if __name__ == "__main__":
    main()
