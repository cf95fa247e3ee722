"""Rank 0 alone steps the LR scheduler (the "only on the main process" habit)."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR

STEPS = int(os.environ.get("REPLICA_STEPS", "200"))
STEP_S = float(os.environ.get("REPLICA_STEP_S", "0"))  # the time a real step would take


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.99)
    g = torch.Generator().manual_seed(7 + rank)
    for step in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        time.sleep(STEP_S)
        if rank == 0:
            scheduler.step()
            if step % 50 == 0:
                print(f"step {step} lr {scheduler.get_last_lr()[0]:.4f}", flush=True)
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
