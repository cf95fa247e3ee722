"""Gradient accumulation with DDP's `no_sync()`, the mean loss all-reduced for logging.

Written for ddpdoctor's FSDP corpus after the DDP docs' `no_sync` recipe. `--rank1-accumulate N`
plants the fault: rank 1 accumulates over N micro-batches where the others take `--accumulate`
(a per-rank setting read from the rank's own config), so rank 1 synchronizes its gradients more
often than the others.

    ddpdoctor run --nproc 2 -- ddp_accumulate.py [--accumulate 4] [--rank1-accumulate 2]
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--rank1-accumulate", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    accumulate = args.accumulate
    if rank == 1 and args.rank1_accumulate:
        accumulate = args.rank1_accumulate
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(args.micro_batches):
        x = torch.randn(16, 20)
        last = (i + 1) % accumulate == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss = model(x).pow(2).mean() / accumulate
            loss.backward()
        if last:
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0:
                print(f"micro-batch {i}: loss {mean.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
