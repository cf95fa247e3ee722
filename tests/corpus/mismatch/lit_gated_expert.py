"""Lightning (`lightning.pytorch` imports, a `DDPStrategy` object) with a two-expert model whose
gate only ever picks the first expert on this data: the second expert's parameters get no
gradient, and DDP without unused-parameter detection fails on both ranks.

    python lit_gated_expert.py
"""

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GatedExperts(LightningModule):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 2)])

    def forward(self, x):
        use_second = bool((x.abs().max() > 100).item())  # never true here
        return self.experts[1 if use_second else 0](x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main():
    loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randint(0, 2, (48,))), batch_size=6)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(GatedExperts(), loader)


if __name__ == "__main__":
    main()
