import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(local_rank)
    model = DDP(model, device_ids=[local_rank])
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # <- script.syncbn_after_ddp
    dist.destroy_process_group()
