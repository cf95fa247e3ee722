"""A DDP script as GPU tutorials publish it: NCCL and CUDA hard-coded.

On a machine without a GPU the preflight reports it before launch, and a launch anyway fails in
every rank at the first CUDA line (NCCL's init needs a GPU too).
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    model = DDP(nn.Linear(8, 2).cuda(), device_ids=[local_rank])
    out = model(torch.randn(4, 8).cuda())
    out.sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
