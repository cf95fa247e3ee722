"""Broken on purpose: one slow rank, a straggler.

What is wrong: rank 1 spends 0.1 s extra on every batch (here a sleep standing in for an expensive
per-sample augmentation, a slower disk, a throttled GPU or a noisy neighbour on its host).

How it shows: nothing fails; the whole job just runs at the pace of its slowest rank. Because every
rank waits for the others in the gradient all_reduce, every rank's step time grows equally, so step
times alone do not point at the culprit: the straggler is the rank whose own work (data wait +
compute) is largest while the others' time waiting inside the all_reduce grows by the same amount.
ddpdoctor names rank 1 as the straggler and says whether data loading or compute is the reason; the
job finishes and the verdict stays healthy.

How to fix it: make the work even: move the expensive preprocessing offline or into DataLoader
workers, check the slow host (disk, thermal throttling, other tenants), balance the data per rank.
"""

import time

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


def augment(x, rank):
    if rank == 1:
        time.sleep(0.1)  # the slow part, only on rank 1
    return x + 0.01 * torch.randn_like(x)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x = augment(x, rank)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    dist.barrier()  # every rank done with its last collective before the teardown
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's threads release the last collective before Python exits


if __name__ == "__main__":
    main()
