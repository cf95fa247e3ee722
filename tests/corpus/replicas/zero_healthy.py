"""A healthy ZeRO-1 job written another way: ZeroRedundancyOptimizer over Adam with a model that
DDP does not wrap (the gradients averaged by hand), a DataLoader with a DistributedSampler, a
scheduler on every rank, rank 0 alone evaluating and saving."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

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
    n = STEPS * 8 * dist.get_world_size()  # STEPS batches of 8 per rank
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True))
    for it, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
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
