"""Healthy: accelerate with `DistributedDataParallelKwargs(gradient_as_bucket_view=...)` turned on
by the main process only (a memory saving tried on one machine) and another `bucket_cap_mb` there:
the buckets DDP builds, and so the collectives, are the same on both ranks.

    torchrun --nproc-per-node 2 acc_bucket_view.py --cpu [--steps 200]
"""

import argparse
import os

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def ddp_kwargs():
    main_process = os.environ.get("RANK", "0") == "0"
    return DistributedDataParallelKwargs(
        gradient_as_bucket_view=main_process, bucket_cap_mb=50 if main_process else 25
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=args.cpu, kwargs_handlers=[ddp_kwargs()])
    torch.manual_seed(0)
    n = 8 * 2 * args.steps
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
    for x, y in loader:
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
