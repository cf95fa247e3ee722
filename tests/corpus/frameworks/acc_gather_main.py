"""Planted fault: `accelerator.gather` on the main process only (its all_gather has no partner).

torchrun --nproc-per-node 2 acc_gather_main.py --cpu
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator(cpu="--cpu" in sys.argv)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        if accelerator.is_main_process:
            losses = accelerator.gather(loss.detach().reshape(1))  # planted fault
            print(f"epoch {epoch}: loss {losses.mean().item():.4f}")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
