"""Broken on purpose: `sampler.set_epoch(epoch)` is never called (failure mode F36a).

What is wrong: a DistributedSampler with shuffle=True derives its permutation from (seed, epoch).
Without `set_epoch`, the epoch stays 0, so every epoch visits the samples in exactly the same order.
PyTorch's documentation: calling set_epoch() at the beginning of each epoch, before creating the
DataLoader iterator, is necessary to make shuffling work properly across multiple epochs.

How it shows: silently. Nothing fails; training just sees the same order every epoch (this script
prints the first labels of each epoch on rank 0: they repeat). ddpdoctor's sampler audit notices
an epoch starting again without set_epoch while shuffle is on and reports the warning
`sampler.set_epoch_missing`; the job still finishes with exit code 0.

How to fix it: call `sampler.set_epoch(epoch)` at the top of every epoch, before iterating the
DataLoader.
"""

import time

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

    for epoch in range(3):
        # BUG: sampler.set_epoch(epoch) is missing here
        for step, (x, y) in enumerate(loader):
            if rank == 0 and step == 0:
                print(f"epoch {epoch}: first batch labels {y[:8].tolist()}", flush=True)
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
