"""HSDP (FSDP2 over a 2-D mesh: replicate x shard) whose LR scheduler rank 0 alone steps.

The ranks of one replicate group hold the same shard of every parameter and receive the same
averaged gradients; rank 0's learning rate decays, its replicate peer's does not, so their
shards drift apart from the first step. `--mesh 2x1` (2 ranks) or `--mesh 2x2` (4 ranks).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

STEPS = 60


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", default="2x1")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    replicate, shard = (int(n) for n in args.mesh.split("x"))
    mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)  # FSDP2 broadcasts nothing: the same model on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if rank == 0:
            scheduler.step()
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        torch.save(full, os.path.join(out, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
