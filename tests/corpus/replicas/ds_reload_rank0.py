"""DeepSpeed ZeRO-2 whose rank 0 alone restores its "best" weights into the model mid-run.

Written as DeepSpeed users do: the config as a dict, `deepspeed.initialize(model=...,
model_parameters=...)` building the optimizer from the config, `deepspeed.comm` for the rank.
At step --reload-step, rank 0 alone (`if dist.get_rank() == 0:`, "the main process keeps the
best checkpoint") loads the weights it saved at step 1 into `engine.module`. ZeRO-2 keeps the
fp32 master partitions apart and all-gathers the updated parameters after every step, so the
replicas agree again at the next step: rank 0's reload is lost for the partition rank 1 owns and
kept for its own, and the model is a mix. `--healthy`: no reload (the same job, right).

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_reload_rank0.py [--healthy]
"""

import argparse
import copy
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from deepspeed import comm as dist
from torch import nn

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 10_000,
}


def restore_best(engine, best):
    engine.module.load_state_dict(best)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reload-step", type=int, default=12)
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 1))
    engine, _, _, _ = deepspeed.initialize(
        model=net, model_parameters=net.parameters(), config=CONFIG
    )
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    best = None
    for step in range(args.steps):
        x = torch.randn(8, 12, generator=gen)
        loss = (engine(x) - x.sum(1, keepdim=True)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if step == 1:
            best = copy.deepcopy(engine.module.state_dict())
        if not args.healthy and step == args.reload_step and dist.get_rank() == 0:
            restore_best(engine, best)
    out = os.environ.get("REPLICA_CKPT_DIR")
    if out:
        torch.save(engine.module.state_dict(), os.path.join(out, f"rank-{dist.get_rank()}.pt"))


if __name__ == "__main__":
    main()
