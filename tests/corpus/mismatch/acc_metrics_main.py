"""accelerate training whose evaluation helper gathers predictions with `gather_for_metrics`,
called from the main process only (planted fault).

    torchrun --nproc-per-node 2 acc_metrics_main.py --cpu
"""

import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def evaluate(accelerator, model, batch):
    x, y = batch
    with torch.no_grad():
        preds = model(x).argmax(-1)
    preds, y = accelerator.gather_for_metrics((preds, y))
    return (preds == y).float().mean().item()


def main():
    accelerator = Accelerator(cpu="--cpu" in sys.argv)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 6), torch.randint(0, 3, (96,)))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=12))
    for epoch in range(3):
        model.train()
        for batch in loader:
            loss = F.cross_entropy(model(batch[0]), batch[1])
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if accelerator.is_main_process:
            acc = evaluate(accelerator, model, batch)  # planted fault: main process only
            accelerator.print(f"epoch {epoch}: accuracy {acc:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
