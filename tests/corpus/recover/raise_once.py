"""An elastic DDP trainer that fails once and is restarted by torchrun.

Written for ddpdoctor's recovery corpus: rank `--fail-rank` raises from a helper function at
step `--fail-step` of the first attempt (or of every attempt with `--always`); torchrun's
`--max-restarts` starts every rank again and the next attempt trains to the end. Each attempt
forms a new gloo group, so run it with a rendezvous that can (`--rdzv-backend c10d`).

    torchrun --nproc-per-node 2 --max-restarts 2 --rdzv-backend c10d \
        --rdzv-endpoint localhost:PORT raise_once.py [--steps 20] [--fail-step 10] [--always]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class LoaderError(RuntimeError):
    pass


def read_batch(step: int, rank: int, fail: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if fail:
        raise LoaderError(f"shard for step {step} is unreadable on rank {rank}")
    x = torch.randn(8, 16)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-step", type=int, default=10)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--always", action="store_true", help="fail in every attempt")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        fail = rank == args.fail_rank and step == args.fail_step and (args.always or attempt == 0)
        x, y = read_batch(step, rank, fail)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"attempt {attempt}: trained {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
