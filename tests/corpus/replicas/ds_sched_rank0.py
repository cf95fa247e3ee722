"""DeepSpeed ZeRO-2 (on the CPU) whose LR scheduler, built over the torch optimizer handed to
deepspeed.initialize, rank 0 alone steps. Each rank updates the partition it owns with its own
learning rate and all-gathers the others: the replicas agree, the model is a mix.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_sched_rank0.py [--healthy]
"""

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks its accelerator

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn

STEPS = 60


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true", help="the scheduler on every rank")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "zero_optimization": {"stage": 2},
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.95)
    rank = torch.distributed.get_rank()
    torch.manual_seed(10 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        engine.backward(F.cross_entropy(engine(x), y))
        engine.step()
        if args.healthy or rank == 0:
            scheduler.step()
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(engine.module.state_dict(), os.path.join(out, f"rank-{rank}.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
