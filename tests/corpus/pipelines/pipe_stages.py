"""A pipeline-parallel MLP as the torch.distributed.pipelining tutorial writes it: each rank
builds its stage of the model by hand, wraps it in a PipelineStage and runs a schedule.

    torchrun --nproc-per-node 2 pipe_stages.py [--schedule gpipe|1f1b] [--steps N]
        [--fault stall|microbatches] [--stall-step S]

Faults: `stall` (the last stage sleeps in its forward at step --stall-step), `microbatches`
(stage 0 alone builds its schedule with twice the microbatches), `fewer-steps` (the last
stage runs one step fewer: the others' sends are never received).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

HIDDEN = 32
BATCH = 16


class Block(nn.Module):
    def __init__(self, stall_step: int | None) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)
        self.stall_step = stall_step
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step == self.stall_step:
            time.sleep(3600)  # the stage stops answering its neighbours
        return torch.relu(self.lin(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--fault", default=None, choices=["stall", "microbatches", "fewer-steps"])
    parser.add_argument("--stall-step", type=int, default=6)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    last = rank == world - 1
    stage_mod = Block(args.stall_step if args.fault == "stall" and last else None)
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))

    n_micro = args.microbatches
    if args.fault == "microbatches" and rank == 0:
        n_micro = 2 * args.microbatches
    loss_fn = nn.MSELoss()
    if args.schedule == "gpipe":
        schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stage, n_microbatches=n_micro, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(stage_mod.parameters(), lr=0.01)

    steps = args.steps - 1 if args.fault == "fewer-steps" and last else args.steps
    for step in range(1, steps + 1):
        stage_mod.step = step
        x = torch.randn(BATCH, HIDDEN)
        target = torch.randn(BATCH, HIDDEN)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif last:
            losses: list[torch.Tensor] = []
            schedule.step(target=target, losses=losses)
            if step % 2 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
        else:
            schedule.step()
        optimizer.step()
    dist.destroy_process_group()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
