"""FSDP2 training with a `Checkpointer` class that saves model and optimizer state through
`torch.distributed.checkpoint.state_dict.get_state_dict` (full, offloaded to the CPU): the call
gathers every shard from every rank. Planted fault: only the writer rank checkpoints.

    ddpdoctor run --nproc 2 -- fsdp_optim_state_rank0.py
"""

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dcp_sd
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Checkpointer:
    def __init__(self, every):
        self.every = every
        self.options = dcp_sd.StateDictOptions(full_state_dict=True, cpu_offload=True)

    def maybe_save(self, step, model, optimizer):
        if step % self.every or dist.get_rank() != 0:  # planted fault: the writer rank only
            return
        model_sd, optim_sd = dcp_sd.get_state_dict(model, optimizer, options=self.options)
        torch.save({"model": model_sd, "optim": optim_sd, "step": step}, f"ckpt-{step}.pt")


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Linear(16, 40), nn.GELU(), nn.Linear(40, 40), nn.GELU(), nn.Linear(40, 2)
    )
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpointer(every=8)
    for step in range(1, 25):
        model(torch.randn(12, 16)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ckpt.maybe_save(step, model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
