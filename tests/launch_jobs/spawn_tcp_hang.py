"""An mp.spawn DDP script with tcp:// init, the way many scripts start their ranks by hand; with
a hang planted on one rank.

    python spawn_tcp_hang.py PORT [--hang-rank R] [--hang-step S] [--steps N]

The parent spawns 2 ranks; each joins the group with rank and world size passed by hand (no
RANK/WORLD_SIZE in its environment). Rank R, at step S, sleeps forever before its forward (blocked
in Python, its peers waiting in the gradient all-reduce).
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2


def work(rank: int, port: int, hang_rank: int, hang_step: int, steps: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if rank == hang_rank and step == hang_step:
            while True:
                time.sleep(1)
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.05)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    a = parser.parse_args()
    mp.spawn(work, args=(a.port, a.hang_rank, a.hang_step, a.steps), nprocs=WORLD)
