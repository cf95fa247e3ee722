"""DeepSpeed's pipeline engine as its pipeline tutorial writes it, on CPU: a PipelineModule of
layers split over 2 stages, engine.train_batch over a data iterator (the engine runs the 1F1B
schedule and sends activations and gradients between the stages itself).

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 ds_pipe.py
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_pipe.py

Faults at step --fault-step: `stall` (stage 1's layer sleeps in its forward), `raise` (it
raises).
"""

import argparse
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks its accelerator

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.pipe import PipelineModule
from torch import nn


class Faulty(nn.Module):
    """The last layer of stage 1, where the planted fault happens."""

    def __init__(self, fault: str | None, fault_step: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 4)
        self.fault, self.fault_step, self.calls = fault, fault_step, 0

    def forward(self, x):
        self.calls += 1
        if self.fault and self.calls > self.fault_step * MICRO_BATCHES:
            if self.fault == "stall":
                time.sleep(3600)  # stage 1 stops answering stage 0
            raise RuntimeError("bad activations on the last stage")
        return self.fc(x)


MICRO_BATCHES = 4


def batches(steps: int):
    torch.manual_seed(0)
    for _ in range(steps * MICRO_BATCHES):
        yield torch.randn(8, 32), torch.randint(0, 4, (8,))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fault", default=None, choices=["stall", "raise"])
    parser.add_argument("--fault-step", type=int, default=5)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    layers = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
              Faulty(args.fault, args.fault_step)]
    net = PipelineModule(layers=layers, num_stages=2, loss_fn=F.cross_entropy,
                         partition_method="uniform")
    config = {
        "train_batch_size": 8 * MICRO_BATCHES,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": MICRO_BATCHES,
        "steps_per_print": 1000,
    }
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
    data = iter(batches(args.steps))
    for step in range(args.steps):
        loss = engine.train_batch(data_iter=data)
        if engine.global_rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(f"rank {engine.global_rank}: done", flush=True)


if __name__ == "__main__":
    main()
