import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model):
    dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = model.to(int(os.environ["LOCAL_RANK"]))
    first = DDP(model, device_ids=[0])  # <- script.device_ids_not_local_rank
    second = DDP(model, device_ids=[rank])  # <- script.device_ids_not_local_rank
    dist.destroy_process_group()
    return first, second
