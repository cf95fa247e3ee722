"""accelerate training whose metric helper is decorated with `@accelerator.on_main_process`
and gathers the eval predictions with `gather_for_metrics` inside it (planted fault: only the
main process runs the helper, so its all-gather has no partner).

    torchrun --nproc-per-node 2 acc_metrics_decorated.py --cpu
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--cpu", action="store_true")
args = parser.parse_args()

accelerator = Accelerator(cpu=args.cpu)
torch.manual_seed(11)
train = DataLoader(TensorDataset(torch.randn(64, 5), torch.randint(0, 2, (64,))), batch_size=8)
evals = DataLoader(TensorDataset(torch.randn(32, 5), torch.randint(0, 2, (32,))), batch_size=8)
model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
model, optimizer, train, evals = accelerator.prepare(model, optimizer, train, evals)


@accelerator.on_main_process
def report(epoch):
    correct = total = 0
    for x, y in evals:
        with torch.no_grad():
            pred = model(x).argmax(-1)
        pred, y = accelerator.gather_for_metrics((pred, y))  # planted fault: main only
        correct += (pred == y).sum().item()
        total += y.numel()
    print(f"epoch {epoch}: accuracy {correct / total:.3f}", flush=True)


for epoch in range(3):
    for x, y in train:
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    report(epoch)
accelerator.end_training()
