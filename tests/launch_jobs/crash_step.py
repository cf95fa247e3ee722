"""A DDP script of the tutorial's env:// kind in which one rank raises at a given step.

python crash_step.py [--crash-rank R] [--crash-step S]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--crash-step", type=int, default=5)
    a = parser.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(16, 1))
    for step in range(40):
        if rank == a.crash_rank and step == a.crash_step:
            raise ValueError(f"bad record at step {step}")
        model(torch.randn(8, 16)).sum().backward()
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
