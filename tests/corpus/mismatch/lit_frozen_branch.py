"""Lightning with a parameter that never gets a gradient (a head defined but unused in
`training_step`): DDP without unused-parameter detection fails on both ranks.

    python lit_frozen_branch.py
"""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(5, 5)
        self.main_head = nn.Linear(5, 1)
        self.aux_head = nn.Linear(5, 1)  # never used: its parameters get no gradient

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.main_head(self.body(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(64, 5), torch.randn(64, 1)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(Regressor(), data)
