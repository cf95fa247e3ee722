"""accelerate's gradient accumulation (`Accelerator(gradient_accumulation_steps=N)` and
`with accelerator.accumulate(model):`), N read from a per-node settings file the way a
launcher script fills it in. Planted fault: rank 1's settings say 2 where rank 0's say 4, so
rank 1 synchronizes its gradients twice as often.

    torchrun --nproc-per-node 2 acc_accum_per_rank.py --cpu
"""

import os
import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

SETTINGS = {"0": {"accumulate": 4}, "1": {"accumulate": 2}}  # planted fault: per rank


def settings():
    return SETTINGS.get(os.environ.get("RANK", "0"), SETTINGS["0"])


def main():
    accelerator = Accelerator(
        cpu="--cpu" in sys.argv, gradient_accumulation_steps=settings()["accumulate"]
    )
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(384, 8), torch.randn(384, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
