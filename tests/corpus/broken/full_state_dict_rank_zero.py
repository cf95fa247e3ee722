"""FSDP2: the full state dict gathered on rank 0 alone before saving it."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    fully_shard(model)
    if dist.get_rank() == 0:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)  # <- script.full_state_dict_rank_zero
        torch.save(state, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
