"""Ray Train with FailureConfig(max_failures=1): worker 1 fails once, the controller retries.

Written for ddpdoctor's recovery corpus after Ray Train's "Get started with PyTorch" guide: a
TorchTrainer on 2 CPU workers; in its first worker group, worker 1 raises at step 3 (`raise`) or
SIGKILLs itself (`sigkill`); Ray prints `[FailurePolicy] RETRY`, starts a new worker group, and
the run finishes. A marker file tells the second group that the failure already happened.
`raise-always` fails in every worker group: the budget runs out and `trainer.fit()` raises.

    python ray_train_retry.py [raise|sigkill|raise-always]
"""

import os
import signal
import sys
import tempfile
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

MODE = sys.argv[1] if len(sys.argv) > 1 else "raise"


def train_func(config):
    model = ray.train.torch.prepare_model(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    marker = Path(config["marker"])
    for step in range(config["steps"]):
        loss = nn.functional.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 1 and step == 3 and (config["mode"] == "raise-always" or not marker.exists()):
            marker.write_text("failed once")
            if config["mode"] == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("worker 1 lost its data shard")
        ray.train.report({"loss": loss.item(), "step": step})


if __name__ == "__main__":
    ray.init()
    work = tempfile.mkdtemp(prefix="ray-retry-")
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": 8, "mode": MODE, "marker": os.path.join(work, "failed")},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=work, failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    print(f"training done: {result.metrics}")
