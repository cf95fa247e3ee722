"""Broken on purpose: a barrier that only rank 0 calls (failure mode F29).

What is wrong: after each epoch rank 0 saves a checkpoint and then calls `dist.barrier()` inside
`if rank == 0:`, "to wait for the others". The other ranks never call that barrier: they go straight
on into the next epoch, whose first backward pass starts DDP's gradient all_reduce. Rank 0 waits in
barrier #K while rank 1 waits in all_reduce #K: the same collective slot, two different operations.

How it shows: the job hangs forever (NCCL: until the watchdog kills it after 10 minutes; gloo: until
its 30-minute timeout). ddpdoctor sees both ranks alive and blocked at the same sequence number in
different collectives, names them side by side ("rank 0: barrier #K; rank 1: all_reduce #K") and
stops the job.

How to fix it: every rank calls every collective, in the same order. Move the barrier out of the
`if`:

    if rank == 0:
        torch.save(model.module.state_dict(), path)
    dist.barrier()
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(samples=256, features=32, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    checkpoint = os.path.join(tempfile.gettempdir(), f"rank0_only_barrier-{os.getpid()}.pt")

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}; saving a checkpoint", flush=True)
            torch.save(model.module.state_dict(), checkpoint)
            dist.barrier()  # BUG: only rank 0 ever reaches this barrier
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
