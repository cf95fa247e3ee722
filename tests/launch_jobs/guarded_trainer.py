"""A trainer in another style: helper functions, a `main()` behind the `__main__` guard, a
timeout given to init_process_group, and a loop that catches the communication error and exits
1 with a message of its own (so its error says nothing of a peer's reset). With SLOW_HOST set,
that host's rank prepares slowly before joining the group. For test_lab_host_lost.py."""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def setup() -> int:
    if socket.gethostname() == os.environ.get("SLOW_HOST"):
        time.sleep(float(os.environ.get("SLOW_S", "120")))
    dist.init_process_group(backend="gloo", timeout=dt.timedelta(minutes=10))
    return dist.get_rank()


def train(steps: int) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        time.sleep(0.05)


def main() -> int:
    rank = setup()
    try:
        train(int(os.environ.get("STEPS", "4000")))
    except RuntimeError:
        print(f"rank {rank}: training stopped, saving nothing", file=sys.stderr)
        return 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
