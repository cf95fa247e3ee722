"""A training loop with HF accelerate, as its quick tour teaches.

torchrun --nproc-per-node 2 acc_healthy.py --cpu   2 ranks, DDP on the CPU (gloo)
accelerate launch --multi_gpu --num_processes 2 acc_healthy.py
    on a machine without a GPU: 2 processes that do not distribute (accelerate 1.15 picks
    DistributedType.NO: each trains alone on the whole data set)
accelerate launch --cpu --num_processes 2 acc_healthy.py   accelerate runs ONE process
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator(cpu="--cpu" in sys.argv)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        model.eval()
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(data.tensors[0][:8]), data.tensors[1][:8])
        losses = accelerator.gather(loss.reshape(1))
        accelerator.print(f"epoch {epoch}: loss {losses.mean().item():.4f}")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
