import os

import torch.distributed as dist


def main():
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "29500"  # <- script.master_port_hardcoded
    dist.init_process_group("gloo")
    dist.destroy_process_group()
