"""FSDP2 with a debug head that a helper runs every few steps on the logging rank only, outside
the model's forward: the head is an FSDP unit of its own, so running it all-gathers its
parameters, a collective the other rank never makes.

    ddpdoctor run --nproc 2 -- fsdp_debug_head.py
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

IS_LOGGER = int(os.environ.get("RANK", "0")) == 0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(20, 20) for _ in range(3))
        self.debug_head = nn.Linear(20, 4)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def log_debug_stats(model, features, step):
    with torch.no_grad():
        logits = model.debug_head(features)
    print(f"step {step}: debug logits {logits.mean().item():.3f}", flush=True)


def main():
    dist.init_process_group(backend="gloo")
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fsdp.fully_shard(block, mesh=mesh)
    fsdp.fully_shard(model.debug_head, mesh=mesh)
    fsdp.fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(16):
        features = model(torch.randn(6, 20))
        features.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if IS_LOGGER and step == 6:
            log_debug_stats(model, features.detach(), step)  # planted fault: rank 0 only
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
