"""Ray Train on a running cluster, as its "Get started with PyTorch" guide teaches: a
TorchTrainer with two CPU workers (gloo), the model through prepare_model, one report per step;
`placement_strategy="STRICT_SPREAD"` puts the two workers on two different nodes. The cluster
comes from RAY_ADDRESS (`ray.init()` joins it).

    python ray_lab_train.py [healthy|stall|sigkill] [STEPS] [HOST]

stall: the worker on HOST (default: worker 1) sleeps in the training function at step 5;
sigkill: it kills itself with SIGKILL at step 5 (as the OOM killer would). Ray Train numbers its
workers itself, so HOST says which one is the culprit.
"""

import os
import signal
import socket
import sys
import tempfile
import time

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

MODE = sys.argv[1] if len(sys.argv) > 1 else "healthy"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
HOST = sys.argv[3] if len(sys.argv) > 3 else None


def train_func(config):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(rank)
    host = config["host"]
    culprit = socket.gethostname() == host if host else rank == 1
    for step in range(config["steps"]):
        inputs, targets = torch.randn(32, 16), torch.randn(32, 1)
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if config["mode"] == "stall" and culprit and step == 5:
            time.sleep(3600)  # planted fault
        if config["mode"] == "sigkill" and culprit and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # planted fault
        ray.train.report({"loss": loss.item(), "step": step})


if __name__ == "__main__":
    ray.init()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": STEPS, "mode": MODE, "host": HOST},
        scaling_config=ScalingConfig(
            num_workers=2, use_gpu=False, placement_strategy="STRICT_SPREAD"
        ),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-results-")),
    )
    result = trainer.fit()
    print(f"training done: {result.metrics}")
