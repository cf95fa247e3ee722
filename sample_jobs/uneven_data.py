"""Broken on purpose: ranks get different amounts of data (failure mode F31).

What is wrong: instead of a DistributedSampler, each rank reads "its own shard" and the shards have
different lengths (rank 0 gets 320 samples, the others 256), so rank 0 runs more training steps per
epoch than its peers. DDP needs every rank to run the same number of steps: each backward pass is a
collective all_reduce of the gradients.

How it shows: the ranks with less data finish the epoch first and wait at the end-of-training
barrier, while rank 0 waits in its next gradient all_reduce for peers that will never join. The job
hangs (until the NCCL watchdog or the gloo timeout, 10 to 30 minutes later). ddpdoctor shows the
ranks at the same collective sequence number in different operations, that they ran a different
number of steps ("uneven inputs"), and stops the job.

How to fix it: give every rank the same number of batches: a DistributedSampler (it pads the data
so it divides evenly; or drop_last=True), or, when the imbalance is inherent, DDP's `model.join()`
context manager (torch.distributed.algorithms.Join), which shadows the collectives of ranks that ran
out of data.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def load_shard(rank, features=32, classes=4):
    """Each rank's "shard file": rank 0's happens to hold 64 samples more than the others'."""
    samples = 320 if rank == 0 else 256
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=torch.Generator().manual_seed(0))).argmax(1)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(load_shard(rank), batch_size=16, shuffle=True)  # BUG: uneven shards
    print(f"rank {rank}: {len(loader)} batches per epoch", flush=True)

    steps = 0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    print(f"rank {rank}: finished after {steps} steps", flush=True)
    dist.barrier()  # wait for everyone before saving
    if rank == 0:
        torch.save(model.module.state_dict(), "/dev/null")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
