"""Rank 0 alone reloads a checkpoint file into `model.module` at step 20, inline."""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 200

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
model = nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
ckpt = os.path.join(tempfile.mkdtemp(), "best.pt")
gen = torch.Generator().manual_seed(100 + rank)
for step in range(STEPS):
    inputs, target = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
    optimizer.zero_grad()
    F.mse_loss(model(inputs), target).backward()
    optimizer.step()
    if rank == 0 and step == 4:
        torch.save(model.module.state_dict(), ckpt)
    if rank == 0 and step == 19:
        model.module.load_state_dict(torch.load(ckpt))
out = os.environ.get("REPLICA_CKPT_DIR")
if out:
    torch.save(model.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
dist.destroy_process_group()
