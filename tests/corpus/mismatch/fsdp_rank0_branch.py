"""FSDP2 with an auxiliary head that only the coordinator evaluates: each FSDP unit all-gathers
its parameters when its forward runs, so rank 0's extra `self.probe(...)` call makes
all-gathers rank 1 never makes.

    ddpdoctor run --nproc 2 -- fsdp_rank0_branch.py
"""

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed import fsdp
from torch.distributed.device_mesh import init_device_mesh


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32))
        self.probe = nn.Linear(32, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x, is_coordinator):
        feats = self.trunk(x)
        if is_coordinator:
            feats = feats + 0.0 * self.probe(feats)
        return self.head(feats)


def build(mesh):
    model = Model()
    fsdp.fully_shard(model.trunk, mesh=mesh)
    fsdp.fully_shard(model.probe, mesh=mesh)
    fsdp.fully_shard(model, mesh=mesh)
    return model


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(1)
    model = build(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(12):
        x = torch.randn(8, 16)
        out = model(x, is_coordinator=dist.get_rank() == 0 and it == 5)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
