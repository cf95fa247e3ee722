"""accelerate: the main process saves the model, then waits for the others, but the
`wait_for_everyone()` is inside the main-process branch (planted fault).

    torchrun --nproc-per-node 2 acc_wait_main.py --cpu
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true")
    return p.parse_args()


def main():
    args = parse()
    accelerator = Accelerator(cpu=args.cpu)
    set_seed(3)
    ds = TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    sgd = torch.optim.SGD(net.parameters(), lr=0.05)
    net, sgd, dl = accelerator.prepare(net, sgd, DataLoader(ds, batch_size=10, shuffle=True))
    for epoch in range(3):
        for xb, yb in dl:
            with accelerator.accumulate(net):
                accelerator.backward(nn.functional.mse_loss(net(xb), yb))
                sgd.step()
                sgd.zero_grad()
        if accelerator.is_local_main_process:
            torch.save(accelerator.unwrap_model(net).state_dict(), f"net-{epoch}.pt")
            accelerator.wait_for_everyone()  # planted fault: only the main process waits


if __name__ == "__main__":
    main()
