"""Tutorial recipe: uneven inputs per rank under `torch.distributed.algorithms.join.Join`.

Written for ddpdoctor's run corpus after PyTorch's "Distributed Training with Uneven Inputs Using
the Join Context Manager" tutorial: each rank has its own number of batches (rank r gets
`--batches + r * --extra`), and the training loop runs inside `Join([model])`, so a rank that runs
out of data early shadows the others' gradient all-reduces (Join's own all-reduces plus DDP's join
hook) until every rank is done, instead of the job hanging.

Healthy: ddpdoctor must give it a healthy verdict, no warning and never stop it; the ranks really
do run different numbers of steps, on purpose.

    ddpdoctor run --nproc 2 -- recipe_join_uneven.py [--batches 10] [--extra 5]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--extra", type=int, default=5, help="more batches per higher rank")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(1, 1, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = [torch.tensor([1.0]) for _ in range(args.batches + rank * args.extra)]
    steps = 0
    with Join([model]):
        for x in inputs:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            steps += 1
    print(f"rank {rank}: {steps} steps, all ranks joined", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
