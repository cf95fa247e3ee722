"""DeepSpeed ZeRO as its getting-started guide writes a training loop, on CPU: a plain torch
optimizer handed to deepspeed.initialize, engine.backward / engine.step.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_zero.py --stage 3
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 ds_zero.py --stage 2

`--eval-rank0 N`: rank 0 alone evaluates every N steps (under ZeRO-3 its forward gathers the
parameters: collectives the other ranks never make).
Faults (on rank 1 at step --fault-step): `stall` (sleeps in its forward), `raise` (its forward
raises).
"""

import argparse
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks its accelerator

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, fault: str | None, fault_step: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 4)
        self.fault, self.fault_step, self.step = fault, fault_step, 0

    def forward(self, x):
        if self.step == self.fault_step and self.fault == "stall":
            time.sleep(3600)  # the rank stops answering its peers
        if self.step == self.fault_step and self.fault == "raise":
            raise RuntimeError("bad batch on this rank")
        return self.fc2(F.relu(self.fc1(x)))


def evaluate(engine) -> float:
    engine.eval()
    with torch.no_grad():
        out = engine(torch.randn(8, 32))
    engine.train()
    return out.sum().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-rank0", type=int, default=0)
    parser.add_argument("--fault", default=None, choices=["stall", "raise"])
    parser.add_argument("--fault-step", type=int, default=5)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = Net(args.fault if rank == 1 else None, args.fault_step)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        # ZeRO-3 keeps parameters under 100k elements whole by default: this small model's too
        "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 1000,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    for step in range(1, args.steps + 1):
        model.step = step
        x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        if args.eval_rank0 and step % args.eval_rank0 == 0 and rank == 0:
            print(f"step {step} eval {evaluate(engine):.3f}", flush=True)
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
