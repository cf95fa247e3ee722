"""Tutorial recipe: gradient accumulation with DDP's `no_sync()`.

Written for ddpdoctor's run corpus after the DDP documentation's recipe: the first
`--accumulate - 1` micro-batches of each optimizer step run forward and backward inside
`model.no_sync()` (no gradient all-reduce), the last one outside it, so the all-reduce happens once
per optimizer step with the accumulated gradients. Collectives are therefore sparser than
forward/backward passes, on every rank alike.

Healthy: ddpdoctor must give it a healthy verdict, no warning and never stop it.

    ddpdoctor run --nproc 2 -- recipe_no_sync.py [--epochs 2] [--steps 8] [--accumulate 4]
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per epoch")
    parser.add_argument("--accumulate", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    n = args.steps * args.accumulate * 16 * dist.get_world_size()
    x_all = torch.randn(n, 20, generator=g)
    data = TensorDataset(x_all, x_all.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        opt.zero_grad()
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % args.accumulate == 0
            # Skip the gradient all-reduce on all but the last micro-batch of each step.
            with contextlib.nullcontext() if last else model.no_sync():
                loss = loss_fn(model(x), y) / args.accumulate
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item() * args.accumulate:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
