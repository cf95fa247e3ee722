"""accelerate with a model that keeps an auxiliary head it no longer uses in its loss: DDP
(which accelerate wraps the model in) finds parameters without a gradient on both ranks.

    torchrun --nproc-per-node 2 acc_unused_head.py --cpu
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 12)
        self.cls_head = nn.Linear(12, 3)
        self.aux_head = nn.Linear(12, 1)  # kept from an older recipe, no longer in the loss

    def forward(self, x):
        return self.cls_head(torch.relu(self.trunk(x)))


def main():
    accelerator = Accelerator(cpu="--cpu" in sys.argv)
    data = TensorDataset(torch.randn(40, 6), torch.randint(0, 3, (40,)))
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=5))
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
