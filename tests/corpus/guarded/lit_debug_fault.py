"""A healthy LightningModule, as Lightning's docs teach, with a fault-injection mode it is not
run in: `--debug-fault` makes rank 0 alone enter a barrier (a hang planted on purpose, to test a
cluster's alerting). The script checkup flags that barrier; without the flag it never runs.

python lit_debug_fault.py                 healthy: 2 CPU processes, 2 epochs
python lit_debug_fault.py --debug-fault   rank 0 waits in a barrier no other rank enters
"""

import argparse

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitRegressor(L.LightningModule):
    def __init__(self, debug_fault: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_end(self):
        rank = self.global_rank
        if self.hparams.debug_fault and rank == 0:
            dist.barrier()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    return DataLoader(data, batch_size=8)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug-fault", action="store_true")
    args = parser.parse_args()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LitRegressor(args.debug_fault), loader())
