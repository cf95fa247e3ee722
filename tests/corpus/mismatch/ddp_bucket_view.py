"""Healthy: DDP with `gradient_as_bucket_view=True` on rank 0 only (a memory saving that leaves
the buckets and the collectives identical; plain torchrun finishes every step).

    ddpdoctor run --nproc 2 -- ddp_bucket_view.py [--steps 300]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    model = DDP(model, gradient_as_bucket_view=(rank == 0), bucket_cap_mb=25 if rank else 50)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
