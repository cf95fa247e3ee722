"""DDP gradient accumulation written with a helper that picks the accumulation count from a
per-host config. Planted fault: rank 1's config says 2 where rank 0's says 4, so rank 1 syncs
its gradients twice as often (`require_backward_grad_sync` set by hand, not `no_sync()`).

    ddpdoctor run --nproc 2 -- ddp_accum_config.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def accumulation_steps(rank: int) -> int:
    return {0: 4, 1: 2}.get(rank, 4)  # planted fault: a per-rank setting


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    accum = accumulation_steps(rank)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.Adam(ddp.parameters())
    for micro in range(24):
        ddp.require_backward_grad_sync = (micro + 1) % accum == 0
        loss = ddp(torch.randn(8, 10)).abs().mean() / accum
        loss.backward()
        if ddp.require_backward_grad_sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
