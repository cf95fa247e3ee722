"""torchft's README example, made small: one replica group per torchrun, torchft's
DistributedDataParallel and Optimizer wrappers, a gloo process group managed by the Manager.

MODE (argv[1]): healthy | sigkill (replica group 1 kills itself in its process's 10th step,
once: its torchrun starts it again and it heals from replica group 0) | stall (replica group 1
sleeps in its 5th step).
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
STEPS = int(os.environ.get("TRAIN_STEPS", 30))
MODE = sys.argv[1] if len(sys.argv) > 1 else "healthy"
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    inner = optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(state_dict):
        model.load_state_dict(state_dict["model"])
        inner.load_state_dict(state_dict["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        # a step commits only with every replica group in it: the groups train in step (one that
        # starts late or restarts holds the others' commits until it has healed)
        min_replica_size=NUM_REPLICA_GROUPS,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{REPLICA_GROUP_ID}",
        timeout=timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    criterion = nn.CrossEntropyLoss()

    for step in range(1, 1_000_000):  # this process's steps (torchft's own count heals ahead)
        inputs, labels = torch.randn(8, 16), torch.randint(0, 4, (8,))
        optimizer.zero_grad()
        loss = criterion(ddp(inputs), labels)
        if REPLICA_GROUP_ID == 1 and step == 10 and MODE == "sigkill" and FIRST_ATTEMPT:
            os.kill(os.getpid(), signal.SIGKILL)  # planted fault
        if REPLICA_GROUP_ID == 1 and step == 5 and MODE == "stall":
            time.sleep(100000)  # planted fault
        loss.backward()
        optimizer.step()
        time.sleep(0.05)
        if manager.current_step() >= STEPS:
            break
        if manager.current_step() >= 50 * STEPS:
            break
    print(f"replica {REPLICA_GROUP_ID}: done at step {manager.current_step()}")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
