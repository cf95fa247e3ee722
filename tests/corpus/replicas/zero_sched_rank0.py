"""DDP with torch's ZeroRedundancyOptimizer (ZeRO-1) whose LR scheduler rank 0 alone steps.

Each rank updates the partition of the parameters it owns, with its own learning rate, and
broadcasts it: the replicas stay bit-identical, but half the model decays its learning rate and
half does not."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 60


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Linear(8, 1)))
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01, momentum=0.9
    )
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.98)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if rank == 0:
            scheduler.step()
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
