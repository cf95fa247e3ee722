"""Pipeline parallelism the way TorchTitan-style scripts set it up: one model is built on every
rank and cut into stages by layer ranges; the schedule is picked by name from a table.

    torchrun --nproc-per-node N pipe_split_model.py [--schedule 1F1B|GPipe] [--fault ...]

Faults: `stall` (the last stage waits on a queue nobody fills, in its loss function, at step
--at), `schedule` (rank 0 picks another schedule than the others).
"""

from __future__ import annotations

import argparse
import os
import queue

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
from torch import nn

SCHEDULES = {"1F1B": pp.Schedule1F1B, "GPipe": pp.ScheduleGPipe}


def build_model(layers: int = 4, width: int = 24) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)])


def cut(model: nn.Sequential, stage: int, stages: int) -> nn.Module:
    per = len(model) // stages
    return model[stage * per : (stage + 1) * per]


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.args = args
        self.step_no = 0
        self.never = queue.Queue()
        self.part = cut(build_model(), self.rank, self.world)
        stage = pp.PipelineStage(self.part, self.rank, self.world, torch.device("cpu"))
        name = args.schedule
        if args.fault == "schedule" and self.rank == 0:
            name = "GPipe" if name == "1F1B" else "1F1B"
        self.schedule = SCHEDULES[name](stage, n_microbatches=4, loss_fn=self.loss)
        self.opt = torch.optim.AdamW(self.part.parameters(), lr=1e-3)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.args.fault == "stall" and self.step_no == self.args.at:
            self.never.get()  # blocks for good
        return ((out - target) ** 2).mean()

    def train(self) -> None:
        for self.step_no in range(self.args.steps):
            batch = torch.randn(8, 24)
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0:
                self.schedule.step(batch)
            elif self.rank == self.world - 1:
                self.schedule.step(target=torch.zeros(8, 24))
            else:
                self.schedule.step()
            self.opt.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", default="1F1B", choices=sorted(SCHEDULES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--at", type=int, default=3)
    parser.add_argument("--fault", choices=["stall", "schedule"])
    dist.init_process_group("gloo")
    Trainer(parser.parse_args()).train()
    dist.destroy_process_group()
