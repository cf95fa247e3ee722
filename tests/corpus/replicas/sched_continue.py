"""The loop's bookkeeping is skipped on every rank but 0 with `continue`, and the LR scheduler's
step sits after it: only rank 0 decays its learning rate."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim import lr_scheduler

STEPS = 200


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


def train(model, opt, sched, gen):
    for it in range(STEPS):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if dist.get_rank() != 0:
            continue
        if it % 40 == 0:
            print(f"it {it} loss {loss.item():.4f}", flush=True)
        sched.step()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    train(ddp, opt, sched, torch.Generator().manual_seed(dist.get_rank()))
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(ddp.module.state_dict(), os.path.join(out, f"rank-{dist.get_rank()}.pt"))
    dist.destroy_process_group()
