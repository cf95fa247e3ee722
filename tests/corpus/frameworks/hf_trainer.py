"""The HF Trainer under torchrun (`torchrun --nproc-per-node 2 hf_trainer.py`): a small model
of its own (the Trainer trains any torch module that returns a loss), no download."""

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Pairs(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


if __name__ == "__main__":
    args = TrainingArguments(
        output_dir="hf_out",
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_train_epochs=2,
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = Trainer(model=Regressor(), args=args, train_dataset=Pairs(64), eval_dataset=Pairs(16))
    trainer.train()
