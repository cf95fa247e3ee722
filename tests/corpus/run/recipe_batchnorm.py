"""Tutorial recipe: batch norm across ranks on the CPU.

Written for ddpdoctor's run corpus. The tutorials convert BatchNorm with
`nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping in DDP; with torch 2.14 on the
CPU that fails ("ValueError: SyncBatchNorm layers only work with GPU modules", raised by DDP; the
forward itself wants CUDA/XPU/privateuse1), so this script does what runs on gloo: it converts only
when CUDA is there, and otherwise keeps plain BatchNorm with DDP's `broadcast_buffers=True` (a
broadcast of rank 0's running statistics before every forward) and averages the running statistics
over ranks with all_reduce at the end of every epoch, as the SyncBatchNorm-less recipes do.

Healthy: ddpdoctor must give it a healthy verdict, no warning and never stop it.

    ddpdoctor run --nproc 2 -- recipe_batchnorm.py [--epochs 2] [--steps 10]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def sync_running_stats(model: nn.Module) -> None:
    world = dist.get_world_size()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            for buf in (module.running_mean, module.running_var):
                dist.all_reduce(buf)
                buf /= world


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    n = args.steps * 16 * dist.get_world_size()
    data = TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )
    if torch.cuda.is_available():
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    model = DDP(net, broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        sync_running_stats(model.module)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
