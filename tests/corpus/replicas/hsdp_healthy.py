"""A healthy HSDP job written another way: a 2-D mesh from the world size, a helper that shards
each block, per-rank dropout seeds after the model is built, a scheduler on every rank, and
rank 0 alone evaluating under no_grad. The replicas of each replicate group stay identical."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

STEPS = 60


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(F.gelu(self.lin(x)))


def shard_blocks(model, mesh):
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(16) for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    world = dist.get_world_size()
    shard = int(os.environ.get("HSDP_SHARD", "1"))
    mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("dp_rep", "dp_shard"))
    torch.manual_seed(1234)
    model = shard_blocks(Net(), mesh)
    torch.manual_seed(dist.get_rank())  # each rank its own data and dropout masks
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    for it in range(STEPS):
        model.train()
        loss = F.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if dist.get_rank() == 0 and it % 40 == 39:
            model.eval()
            with torch.no_grad():
                print(f"it {it} loss {loss.item():.4f}", flush=True)
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        torch.save(full, os.path.join(out, f"rank-{dist.get_rank()}.pt"))
    dist.destroy_process_group()
