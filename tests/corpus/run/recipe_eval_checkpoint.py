"""Tutorial recipe: rank 0 evaluates and checkpoints between epochs while the others wait.

Written for ddpdoctor's run corpus after the pattern of the PyTorch DDP tutorials
(`if rank == 0: evaluate(); torch.save(...)`): after every epoch rank 0 alone runs a validation
pass for `--eval-s` seconds (real forward passes over a held-out set, repeated until the time is
up) and saves a checkpoint of a `--checkpoint-mb` model with torch.save, while the other ranks go
on into the next epoch's first gradient all-reduce (after the last epoch: a final barrier) and wait
there for it.

Healthy: rank 0 is busy (CPU time advancing, stack moving), the others wait; ddpdoctor must not
call it a hang, warn, or stop it. The default 10 s is past ddpdoctor's in-training hang floor (5 s).

    ddpdoctor run --nproc 2 -- recipe_eval_checkpoint.py [--epochs 2] [--eval-s 10]
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    return TensorDataset(x, (x[:, :4].sum(dim=1) > 0).long())


def evaluate(model: nn.Module, data: TensorDataset, seconds: float) -> float:
    """Validation passes until `seconds` have passed (a real eval loop stands in for a big set)."""
    model.eval()
    start = time.monotonic()
    correct = total = 0
    with torch.no_grad():
        while time.monotonic() - start < seconds or total == 0:
            for x, y in DataLoader(data, batch_size=256):
                correct += (model(x).argmax(dim=1) == y).sum().item()
                total += len(y)
    model.train()
    return correct / total


def checkpoint(model: nn.Module, size_mb: int, path: str) -> None:
    # The saved state carries a large buffer besides the model so that the write takes seconds.
    state = {"model": model.state_dict(), "ema": torch.randn(size_mb * 262144)}
    torch.save(state, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--eval-s", type=float, default=10.0)
    parser.add_argument("--checkpoint-mb", type=int, default=200)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train = make_data(args.steps * 32 * dist.get_world_size(), seed=0)
    val = make_data(2048, seed=1)
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as tmp:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
            if rank == 0:
                t0 = time.monotonic()
                acc = evaluate(model.module, val, args.eval_s)
                checkpoint(model.module, args.checkpoint_mb, os.path.join(tmp, f"epoch{epoch}.pt"))
                print(f"epoch {epoch}: loss {loss.item():.3f} val acc {acc:.3f} "
                      f"(eval + checkpoint {time.monotonic() - t0:.1f} s)", flush=True)
        dist.barrier()  # after the last epoch the others wait here for rank 0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
