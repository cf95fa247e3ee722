"""A healthy accelerate training loop, as its quick tour teaches, with a fault-injection mode it
is not run in: `--debug-fault` makes the main process alone enter a barrier. The script checkup
flags that barrier; without the flag it never runs.

torchrun --nproc-per-node 2 acc_debug_fault.py --cpu                 healthy
torchrun --nproc-per-node 2 acc_debug_fault.py --cpu --debug-fault   rank 0 waits alone
"""

import argparse

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--debug-fault", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=args.cpu)
    rank = accelerator.process_index
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
        if args.debug_fault and rank == 0:
            dist.barrier()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
