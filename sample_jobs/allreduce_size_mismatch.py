"""Broken on purpose: an all_reduce whose tensor size differs across ranks (failure mode F30).

What is wrong: after each epoch every rank counts the labels it saw with `torch.bincount(labels)`
and all-reduces the counts. `bincount` without `minlength` returns max(label) + 1 entries, so a rank
whose shard lacks the highest class produces a shorter tensor: here rank 0 only sees classes 0 to 3
(4 entries) while rank 1 also sees class 4 (5 entries).

How it shows: on gloo the rank that receives the unexpected size aborts (`gloo::EnforceNotMet ...
Received data size doesn't match expected size. Is there a distributed collective mismatch in your
code?`, exit code -6, SIGABRT) and the other rank then fails with "Connection reset by peer"; on
NCCL it may hang or silently reduce the wrong bytes. ddpdoctor shows both ranks in the same
all_reduce with their different shapes ("all_reduce #K of [4]" vs "of [5]").

How to fix it: make the shape independent of the rank's data: `torch.bincount(labels,
minlength=num_classes)`; in general pad to a common shape, or use all_gather_object for data of
varying size.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(samples=256, features=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    # An unshuffled 2-rank sampler gives rank 0 the even and rank 1 the odd indices: class 4 only
    # ever occurs at odd indices, so rank 0 never sees it.
    i = torch.arange(samples)
    y = torch.where(i % 2 == 0, (i // 2) % 4, (i // 2) % 5)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = []
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(y)
        counts = torch.bincount(torch.cat(seen))  # BUG: no minlength, so the size varies by rank
        dist.all_reduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}, label counts {counts.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
