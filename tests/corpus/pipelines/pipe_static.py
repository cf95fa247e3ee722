"""A pipeline whose stages declare the tensors they exchange: each rank hands PipelineStage
example tensors for what it receives (input_args) and what it sends (output_args), as the
pipelining docs' static mode does, so no shapes are inferred at the first step.

    torchrun --nproc-per-node 2 pipe_static.py [--steps N] [--fault shapes]

Fault `shapes`: the last stage declares its input with the whole batch's size instead of one
microbatch's (the batch size where the microbatch size was meant).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

BATCH, MICROBATCHES, WIDTH = 16, 4, 24


def build_stage(rank: int, world: int, fault: str | None) -> tuple[nn.Module, PipelineStage]:
    torch.manual_seed(rank)
    layer = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU())
    micro = BATCH // MICROBATCHES
    rows_in = BATCH if fault == "shapes" and rank == world - 1 else micro
    # what a stage sends carries a gradient back; what the first stage receives (data) does not
    example_in = torch.zeros(rows_in, WIDTH, requires_grad=rank > 0)
    example_out = torch.zeros(micro, WIDTH, requires_grad=True)
    stage = PipelineStage(
        layer, rank, world, torch.device("cpu"), input_args=example_in, output_args=example_out
    )
    return layer, stage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fault", choices=["shapes"], default=None)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layer, stage = build_stage(rank, world, args.fault)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
    for step in range(args.steps):
        opt.zero_grad()
        if rank == 0:
            schedule.step(torch.randn(BATCH, WIDTH))
        elif rank == world - 1:
            schedule.step(target=torch.randn(BATCH, WIDTH))
        else:
            schedule.step()
        opt.step()
        if rank == 0:
            print(f"step {step} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
