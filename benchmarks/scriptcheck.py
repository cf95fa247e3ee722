"""How long the script checkup takes on a ~2,000-line training script, against `ast.parse` alone.

Generates a script by repeating realistic DDP code (setup, sampler, loader, a trainer class, saving),
then times `check_scripts` and `ast.parse` of the same file, interleaved so both see the same
machine load, and prints medians and spreads. Budget: < 0.5 s for the checkup.

    python benchmarks/scriptcheck.py [--lines 2000] [--runs 15]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ddpdoctor.checks.scriptcheck import check_scripts

HEADER = """\
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""

BLOCK = """

def setup_{n}():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    return local_rank


class Trainer{n}:
    def __init__(self, model, dataset, local_rank, epochs={n}):
        self.rank = dist.get_rank()
        self.local_rank = local_rank
        self.model = DDP(model.to(local_rank), device_ids=[local_rank])
        self.sampler = DistributedSampler(dataset, shuffle=True)
        self.loader = DataLoader(dataset, batch_size=32, sampler=self.sampler, num_workers=2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.epochs = epochs

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def train(self):
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            total = torch.zeros(1, device=self.local_rank)
            for x, y in self.loader:
                total += self.step(x.to(self.local_rank), y.to(self.local_rank))
            dist.all_reduce(total)
            if self.rank == 0:
                print(f"epoch {{epoch}} loss {{total.item()}}")
                torch.save(self.model.module.state_dict(), "checkpoint_{n}.pt")
            dist.barrier()


def main_{n}(model, dataset):
    local_rank = setup_{n}()
    Trainer{n}(model, dataset, local_rank).train()
    dist.destroy_process_group()
"""


def generate(lines: int) -> str:
    parts, n = [HEADER], 0
    while sum(p.count("\n") for p in parts) < lines:
        parts.append(BLOCK.format(n=n))
        n += 1
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.py"
        text = generate(args.lines)
        path.write_text(text)
        check_scripts([str(path)])  # warm-up: imports, first-call caches
        checkup: list[float] = []
        parse: list[float] = []
        for _ in range(args.runs):  # interleaved: both see the same load
            start = time.perf_counter()
            ast.parse(path.read_text(), filename=str(path))
            parse.append(time.perf_counter() - start)
            start = time.perf_counter()
            findings = check_scripts([str(path)])
            checkup.append(time.perf_counter() - start)
    problems = [f for f in findings if f.severity.value != "info"]
    med_c, med_p = statistics.median(checkup), statistics.median(parse)
    print(f"script: {text.count(chr(10))} lines, {args.runs} runs, {len(problems)} warnings/errors")
    print(
        f"checkup   median {med_c * 1000:7.1f} ms  (min {min(checkup) * 1000:.1f}, max {max(checkup) * 1000:.1f})"
    )
    print(
        f"ast.parse median {med_p * 1000:7.1f} ms  (min {min(parse) * 1000:.1f}, max {max(parse) * 1000:.1f})"
    )
    print(
        f"ratio checkup/parse: {med_c / med_p:.1f}x; budget 500 ms: {'ok' if med_c < 0.5 else 'OVER'}"
    )
    return 0 if med_c < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
