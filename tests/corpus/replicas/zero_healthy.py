"""A healthy ZeRO-1 job written another way: ZeroRedundancyOptimizer over Adam with a model that
DDP does not wrap (the gradients averaged by hand), a scheduler on every rank, per-rank data,
rank 0 alone evaluating and saving."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO

STEPS = 60


def average_gradients(model):
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 1))
    for p in model.parameters():  # the same start on every rank
        dist.broadcast(p.data, src=0)
    opt = ZeRO(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.5)
    torch.manual_seed(100 + dist.get_rank())
    for it in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 1)).backward()
        average_gradients(model)
        opt.step()
        sched.step()
        if dist.get_rank() == 0 and it % 40 == 39:
            with torch.no_grad():
                model(torch.randn(4, 16))
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(model.state_dict(), os.path.join(out, f"rank-{dist.get_rank()}.pt"))
    dist.destroy_process_group()
