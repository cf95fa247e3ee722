"""Broken on purpose: an exception on one rank (failure mode F41).

What is wrong: rank 1 hits a bad record at its 7th step and raises ValueError. Nothing is wrong with
the other ranks, yet they fail too: they were waiting for rank 1 in the gradient all_reduce, and its
death closes their connections.

How it shows: on gloo the other ranks fail at once with "Connection closed by peer" / "Connection
reset by peer"; on NCCL they may hang until the watchdog fires. torchrun's failure table names the
exit it noticed first, which is often one of those victims. ddpdoctor orders the failures by time:
rank 1's ValueError is the root cause, with its traceback; the peers' errors are labelled as
consequences.

How to fix it: fix the first failure (here, validate or skip bad records); ignore the consequences.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(samples=512, features=32, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def check_record(rank, step):
    if rank == 1 and step == 7:
        raise ValueError(f"corrupt record in shard {rank} at step {step}: bad label -1")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            step += 1
            check_record(rank, step)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
