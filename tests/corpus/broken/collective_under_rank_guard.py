import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    loss = torch.zeros(1)
    if rank == 0:
        dist.all_reduce(loss)  # <- script.collective_under_rank_guard
        print(loss)
    if dist.get_rank() == 0:
        dist.barrier()  # <- script.collective_under_rank_guard
    dist.destroy_process_group()
