import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model):
    dist.init_process_group("nccl")
    model = model.cuda()  # <- script.device_hardcoded
    ddp = DDP(model)
    dist.destroy_process_group()
    return ddp
