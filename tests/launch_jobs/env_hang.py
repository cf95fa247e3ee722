"""A DDP script of the tutorial's env:// kind (it reads RANK, WORLD_SIZE, LOCAL_RANK, as under
torchrun or `srun python ddp.py`), with a hang planted on one rank.

    python env_hang.py [--hang-rank R] [--hang-step S] [--steps N]

Rank R, at step S, sleeps forever before its forward; -1 (the default) plants none.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    a = parser.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    print(f"rank {rank} of {world}, local rank {os.environ['LOCAL_RANK']}", flush=True)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(a.steps):
        if rank == a.hang_rank and step == a.hang_step:
            while True:
                time.sleep(1)
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
