"""Ray Train as its "Get started with PyTorch" guide teaches: a TorchTrainer with
ScalingConfig(num_workers=2, use_gpu=False), the model through prepare_model, one report per step.

    python ray_train.py [healthy|stall|sigkill]

stall: worker 1 sleeps in the training function at step 5; sigkill: worker 1 kills itself with
SIGKILL at step 5 (as the OOM killer would).
"""

import os
import signal
import sys
import tempfile
import time

import torch
from torch import nn

import ray
import ray.train
import ray.train.torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

MODE = sys.argv[1] if len(sys.argv) > 1 else "healthy"
STEPS = 8


def train_func(config):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(rank)
    for step in range(config["steps"]):
        inputs, targets = torch.randn(32, 16), torch.randn(32, 1)
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if config["mode"] == "stall" and rank == 1 and step == 5:
            time.sleep(3600)  # planted fault
        if config["mode"] == "sigkill" and rank == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # planted fault
        ray.train.report({"loss": loss.item(), "step": step})


if __name__ == "__main__":
    ray.init()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": STEPS, "mode": MODE},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-results-")),
    )
    result = trainer.fit()
    print(f"training done: {result.metrics}")
