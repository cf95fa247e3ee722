"""Broken on purpose: one rank stuck in data loading (failure mode F42).

What is wrong: on rank 1 a DataLoader worker process blocks for good while reading one sample. Here
it is simulated with a read that never returns; in real jobs it is a stalled network filesystem, a
fork-unsafe library deadlocking in a forked worker (OpenCV, a lock held by another thread at fork
time), or a worker waiting on CUDA.

How it shows: it looks like a communication hang, because the healthy ranks sit in the gradient
all_reduce waiting for rank 1 — but rank 1 is alive and not in any collective: its main thread waits
for the next batch (py-spy shows it in `_MultiProcessingDataLoaderIter._get_data`). The job hangs
forever (the DataLoader's default timeout=0 waits indefinitely). ddpdoctor names rank 1 as the rank
that never reached the all_reduce, shows where it is, and stops the job.

How to fix it: find what the worker waits on (py-spy dump --pid <worker pid>); for fork-unsafe
libraries use `multiprocessing_context="spawn"`, fewer workers, or `cv2.setNumThreads(0)`; give the
DataLoader a `timeout=` so a stuck worker raises instead of hanging.
"""

import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RecordsOnDisk(Dataset):
    """Samples "read from storage"; on `stall_rank`, the read of sample 40 onward never returns."""

    def __init__(self, rank, stall_rank=1, stall_from=40, samples=512):
        self.rank, self.stall_rank, self.stall_from = rank, stall_rank, stall_from
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 32, generator=g)
        self.y = (self.x @ torch.randn(32, 4, generator=g)).argmax(dim=1)
        self.reads = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self.reads += 1
        if self.rank == self.stall_rank and self.reads >= self.stall_from:
            threading.Event().wait()  # the stalled read: blocks forever
        return self.x[index], self.y[index]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = RecordsOnDisk(rank)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=1)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader, start=1):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
