"""A healthy DDP training script: the pattern the PyTorch DDP tutorial teaches.

What it does: every rank builds the same model, wraps it in DistributedDataParallel, reads its own
share of the data through a DistributedSampler, calls `sampler.set_epoch(epoch)` every epoch, and
tears the process group down at the end. The short pause after that is a workaround for gloo in
torch 2.x: a process that exits while the group's worker threads are still releasing its last
collective can abort at exit ("terminate called without an active exception", SIGABRT) although
training succeeded.

How it shows: every rank finishes; `ddpdoctor run` reports the verdict "healthy" and exits 0.

    ddpdoctor run --no-tui --nproc 2 -- sample_jobs/healthy.py
    torchrun --nproc-per-node 2 sample_jobs/healthy.py          # the same, uninstrumented

`--steps N` stops after N training steps; `--report-time` prints the training loop's wall time
(the overhead benchmark compares it with and without ddpdoctor); `--hidden` widens the model.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(samples=1024, features=32, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    parser.add_argument("--report-time", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    steps = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if args.steps is not None and steps >= args.steps:
                break
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
        if args.steps is not None and steps >= args.steps:
            break
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if args.report_time and rank == 0:
        print(f"train loop: {steps} steps in {elapsed:.4f} s ({cpu:.4f} s of CPU)", flush=True)
    dist.barrier()  # every rank done with its last collective before the teardown
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's threads release the last collective before Python exits


if __name__ == "__main__":
    main()
