"""Uneven DataLoaders per rank, evened by torch's Join, epoch after epoch.

Written for ddpdoctor's run corpus in another style than recipe_join_uneven.py: each rank builds
its own shard as a DataLoader of a different length (rank r gets `--batches + r * --extra`
batches an epoch: 4 and 7 by default), and a helper runs one epoch inside
`Join([model], throw_on_early_termination=False)`, for several epochs with Adam. The ranks with
more batches are evened by Join's shadow collectives at the end of every epoch.

Healthy: ddpdoctor must give it a healthy verdict, no warning (the loaders really are uneven, on
purpose, and Join makes that safe) and never stop it.

    ddpdoctor run --nproc 2 -- recipe_join_loader.py [--epochs 3] [--batches 4] [--extra 3]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def shard_for(rank: int, batches: int, batch_size: int = 8) -> DataLoader:
    generator = torch.Generator().manual_seed(rank)
    samples = batches * batch_size
    features = torch.randn(samples, 10, generator=generator)
    targets = torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(features, targets), batch_size=batch_size, shuffle=True)


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> int:
    loss_fn = nn.MSELoss()
    seen = 0
    with Join([model], throw_on_early_termination=False):
        for features, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(features), targets).backward()
            optimizer.step()
            seen += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--extra", type=int, default=3, help="more batches per higher rank")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = shard_for(rank, args.batches + rank * args.extra)
    for epoch in range(args.epochs):
        seen = train_epoch(model, loader, optimizer)
        print(f"rank {rank} epoch {epoch}: {seen} batches", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
