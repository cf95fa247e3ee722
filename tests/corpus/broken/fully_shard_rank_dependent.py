"""FSDP2: rank 1 wraps one more submodule than the others."""

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1))
    fully_shard(model[0])
    if dist.get_rank() == 1:
        fully_shard(model[1])  # <- script.fully_shard_rank_dependent
    fully_shard(model)
    model(nn.init.zeros_(model[0].weight.new_empty(2, 8))).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
