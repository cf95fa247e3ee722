"""Lightning: `self.trainer.strategy.barrier()` only on rank 0 (a rank-conditional collective).

gloo pairs rank 0's extra barrier with the barrier Lightning makes on rank 1 to reduce the
epoch's logged loss, so the ranks visibly disagree one call later (rank 0 in that barrier, rank
1 in the all_reduce after it); the call sites say where it started: the barrier line, rank 0.
"""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        self.log("loss", loss, on_epoch=True, sync_dist=True)  # every rank: fine
        return loss

    def on_train_epoch_end(self):
        if self.global_rank == 0:
            self.trainer.strategy.barrier()  # <- script.collective_under_rank_guard

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
