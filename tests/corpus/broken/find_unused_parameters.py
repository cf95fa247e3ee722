import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model):
    dist.init_process_group("gloo")
    ddp = DDP(model, find_unused_parameters=True)  # <- script.find_unused_parameters
    dist.destroy_process_group()
    return ddp
