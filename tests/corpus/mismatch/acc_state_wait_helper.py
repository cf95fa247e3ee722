"""accelerate without an `Accelerator` in the helper: a `save_artifacts` function takes
`PartialState()` (the process state accelerate shares) and waits for the others with
`state.wait_for_everyone()` after writing. Planted fault: the helper is called under
`if state.is_main_process:`, so only the main process waits.

    torchrun --nproc-per-node 2 acc_state_wait_helper.py --cpu
"""

import sys

import torch
from accelerate import Accelerator, PartialState
from torch.utils.data import DataLoader, TensorDataset


def save_artifacts(model, epoch):
    state = PartialState()
    torch.save(model.state_dict(), f"model-{epoch}.pt")
    state.wait_for_everyone()


def main():
    accelerator = Accelerator(cpu="--cpu" in sys.argv)
    state = PartialState()
    torch.manual_seed(5)
    data = TensorDataset(torch.randn(48, 3), torch.randn(48, 1))
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=6))
    for epoch in range(3):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.l1_loss(model(x), y))
            opt.step()
            opt.zero_grad()
        if state.is_main_process:
            save_artifacts(accelerator.unwrap_model(model), epoch)  # planted fault
    accelerator.end_training()


if __name__ == "__main__":
    main()
