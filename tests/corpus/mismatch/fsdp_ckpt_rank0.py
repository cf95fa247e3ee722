"""FSDP2 training that saves a consolidated checkpoint with torch's distributed checkpoint API
(`get_model_state_dict` with `full_state_dict=True`). Planted fault: the checkpoint helper is
called on rank 0 only (at step 10): the full state dict all-gathers every shard, a collective
rank 1 never makes while it goes on to step 11.

    ddpdoctor run --nproc 2 -- fsdp_ckpt_rank0.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def save_checkpoint(model, path):
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    torch.save(state, path)


def train():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 4)
    )
    for i in (0, 2):
        fully_shard(net[i], mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for step in range(1, 31):
        loss = net(torch.randn(16, 24)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and step % 10 == 0:
            save_checkpoint(net, f"ckpt-{step}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
