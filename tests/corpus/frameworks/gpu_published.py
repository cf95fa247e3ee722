"""GPU code as published (pytorch/examples ddp-tutorial-series multigpu_torchrun.py's setup):
NCCL and `torch.cuda.set_device`, run on a machine without a GPU."""

import os

import torch
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # planted fault
    init_process_group(backend="nccl")


def main():
    ddp_setup()
    gpu_id = int(os.environ["LOCAL_RANK"])
    model = DDP(nn.Linear(8, 1).to(gpu_id), device_ids=[gpu_id])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 8, device=gpu_id)).sum().backward()
        optimizer.step()
    destroy_process_group()


if __name__ == "__main__":
    main()
