"""FSDP2 training as torch's docs teach it, on the CPU (gloo), with SPMD faults to plant.

Written for ddpdoctor's FSDP corpus after the FSDP2 tutorial (`fully_shard` each block, then the
root; an optimizer over the sharded parameters) and the DeviceMesh recipe (`init_device_mesh`
with a 1-D mesh, or a 2-D one for HSDP: replicate across the first dimension, shard across the
second). `--fault` plants one break of the SPMD contract on rank 1 (or 0):

    extra-wrap        rank 1 calls fully_shard on one more submodule (the head)
    frozen-param      rank 1 freezes one parameter (requires_grad_(False)) before wrapping
    rank0-submodule   rank 0 runs the optional block (`extra`) in its second step
    rank0-state-dict  rank 0 alone gathers a full state dict (DTensor.full_tensor())

    ddpdoctor run --nproc 2 -- fsdp2_train.py [--mesh 2 | --mesh 2x2] [--steps 4] [--fault F]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.lin(x)))


class Net(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.extra = Block(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        if use_extra:
            x = self.extra(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", default="2", help="2 (FSDP) or 2x2 (HSDP: replicate x shard)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fault", default="")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shape = tuple(int(n) for n in args.mesh.split("x"))
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    torch.manual_seed(0)
    model = Net()
    if args.fault == "frozen-param" and rank == 1:
        model.blocks[1].lin.bias.requires_grad_(False)
    for block in [*model.blocks, model.extra]:
        fully_shard(block, mesh=mesh)
    if args.fault == "extra-wrap" and rank == 1:
        fully_shard(model.head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(8, 32)
        use_extra = args.fault == "rank0-submodule" and rank == 0 and step == 1
        loss = model(x, use_extra=use_extra).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.fault == "rank0-state-dict" and rank == 0 and step == 1:
            full = {k: v.full_tensor() for k, v in model.state_dict().items()}
            torch.save(full, "checkpoint.pt")
    if rank == 0:
        print(f"loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
