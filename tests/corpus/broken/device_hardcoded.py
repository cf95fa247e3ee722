import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model):
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)  # <- script.device_hardcoded
    model = model.to(0)
    ddp = DDP(model, device_ids=[torch.cuda.current_device()])
    dist.destroy_process_group()
    return ddp
