"""FSDP2: rank 0 freezes the embedding, the other ranks train it."""

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 1))
    if rank == 0:
        model[0].weight.requires_grad_(False)  # <- script.requires_grad_rank_dependent
    fully_shard(model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
