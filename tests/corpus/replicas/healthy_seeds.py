"""A healthy DDP job: per-rank dropout seeds (`torch.manual_seed(rank)` after DDP broadcast the
weights), BatchNorm buffers broadcast by DDP, a scheduler stepped on every rank, and rank 0 alone
saving and evaluating (writes nothing into the replica)."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 200


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(
        nn.Sequential(
            nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1)
        )
    )
    torch.manual_seed(rank)  # each rank its own dropout masks and data
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    for step in range(STEPS):
        model.train()
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
        if rank == 0 and step % 50 == 49:
            model.eval()
            with torch.no_grad():
                model.module(torch.randn(4, 16))
            torch.save(model.module.state_dict(), os.devnull)
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
