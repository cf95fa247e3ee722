"""Rank 0 alone reloads its "best checkpoint" into the DDP model at step 20 (in a helper)."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 200


def restore_best(model, best):
    """Go back to the best weights seen so far (rank 0 keeps them)."""
    model.load_state_dict(best)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    best = None
    g = torch.Generator().manual_seed(1 + rank)
    for step in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 5:
            best = {k: v.clone() for k, v in model.state_dict().items()}
        if rank == 0 and step == 19:
            restore_best(model, best)
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(model.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
