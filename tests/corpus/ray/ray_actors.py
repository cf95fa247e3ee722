"""The RL stacks' pattern (verl, OpenRLHF): the job creates its own Ray actors, and each one joins
a torch process group in a method and trains a DDP model.

    python ray_actors.py [healthy|stall|sigkill]

stall: rank 1 sleeps in its training loop at step 5; sigkill: rank 1 kills itself with SIGKILL
at step 5.
"""

import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ray

MODE = sys.argv[1] if len(sys.argv) > 1 else "healthy"
WORLD_SIZE = 2
STEPS = 8


@ray.remote(num_cpus=1)
class TrainWorker:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def free_port(self) -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def setup(self, master_port: int) -> None:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
        )

    def train(self, steps: int, mode: str) -> float:
        torch.manual_seed(self.rank)
        model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss = torch.zeros(())
        for step in range(steps):
            inputs, targets = torch.randn(32, 16), torch.randn(32, 1)
            loss = nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if mode == "stall" and self.rank == 1 and step == 5:
                time.sleep(3600)  # planted fault
            if mode == "sigkill" and self.rank == 1 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # planted fault
        dist.destroy_process_group()
        return loss.item()


if __name__ == "__main__":
    ray.init()
    workers = [
        TrainWorker.options(name=f"trainer-{rank}").remote(rank, WORLD_SIZE)
        for rank in range(WORLD_SIZE)
    ]
    port = ray.get(workers[0].free_port.remote())
    ray.get([w.setup.remote(port) for w in workers])
    losses = ray.get([w.train.remote(STEPS, MODE) for w in workers])
    print(f"training done: {losses}")
