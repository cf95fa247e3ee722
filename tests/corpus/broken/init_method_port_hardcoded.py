import os

import torch.distributed as dist


def main():
    dist.init_process_group(  # <- script.init_method_port_hardcoded
        "gloo",
        init_method="tcp://10.0.0.1:23456",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    dist.destroy_process_group()
