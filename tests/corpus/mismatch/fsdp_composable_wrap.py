"""FSDP2 through the older `torch.distributed._composable.fsdp` path, a wrap policy written as a
predicate over module names (the way many codebases ported FSDP1's auto-wrap). Planted fault:
the policy reads a per-rank config, so rank 1 alone also shards the `decoder` block.

    ddpdoctor run --nproc 2 -- fsdp_composable_wrap.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.device_mesh import DeviceMesh

CONFIG = {0: {"shard_decoder": False}, 1: {"shard_decoder": True}}


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 24), nn.SiLU(), nn.Linear(24, 6))
        self.bottleneck = nn.Linear(6, 6)
        self.decoder = nn.Sequential(nn.Linear(6, 24), nn.SiLU(), nn.Linear(24, 12))

    def forward(self, x):
        return self.decoder(self.bottleneck(self.encoder(x)))


def should_wrap(name, cfg):
    return name == "encoder" or (name == "decoder" and cfg["shard_decoder"])


def apply_fsdp(model, mesh, cfg):
    for name, child in model.named_children():
        if should_wrap(name, cfg):
            fully_shard(child, mesh=mesh)  # planted fault: rank 1 also wraps the decoder
    return fully_shard(model, mesh=mesh)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    mesh = DeviceMesh("cpu", list(range(dist.get_world_size())))
    torch.manual_seed(7)
    model = apply_fsdp(AutoEncoder(), mesh, CONFIG[dist.get_rank()])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(15):
        x = torch.randn(10, 12)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
