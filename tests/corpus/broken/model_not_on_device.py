import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = nn.Linear(4, 4)
    ddp = DDP(model, device_ids=[local_rank])  # <- script.model_not_on_device
    dist.destroy_process_group()
    return ddp
