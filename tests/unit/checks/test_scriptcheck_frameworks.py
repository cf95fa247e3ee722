"""The script checkup knows the frameworks' rank guards and collectives: Lightning's
`self.global_rank == 0`, `self.trainer.is_global_zero`, `@rank_zero_only`, accelerate's
`accelerator.is_main_process`, around `self.log(..., sync_dist=True)`, `self.all_gather`,
`strategy.barrier()`, `accelerator.gather()` ...; healthy scripts as the docs teach them get
nothing."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ddpdoctor.checks.scriptcheck import check_scripts
from ddpdoctor.findings import Severity

CORPUS = Path(__file__).resolve().parents[3] / "tests" / "corpus" / "framework_faults"
RULE = "script.collective_under_rank_guard"
MARK = re.compile(r"# <- (script\.[a-z_]+)")

LIGHTNING_HEAD = """
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only


class Model(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
"""
ACCELERATE_HEAD = """
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(batch).sum()
"""


def findings(tmp_path: Path, text: str) -> list[tuple[str, int, str]]:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return [
        (f.rule, f.line, f.summary)
        for f in check_scripts([str(path)])
        if f.severity is not Severity.INFO
    ]


def lines_of(found, rule=RULE):
    return [line for r, line, _ in found if r == rule]


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.py")), ids=lambda p: p.name)
def test_framework_corpus_gives_its_marked_rule(path: Path) -> None:
    marks = {
        (m.group(1), n)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (m := MARK.search(line))
    }
    got = {(f.rule, f.line) for f in check_scripts([str(path)]) if f.severity is not Severity.INFO}
    assert got == marks


LIGHTNING_FAULTS = {
    "global_rank_log_sync": (
        "        if self.global_rank == 0:\n            self.log('loss', loss, sync_dist=True)\n",
        "self.log(..., sync_dist=True) runs only under the rank guard",
    ),
    "is_global_zero_all_gather": (
        "        if self.trainer.is_global_zero:\n            self.all_gather(loss)\n",
        "self.all_gather() runs only",
    ),
    "trainer_global_rank_strategy_barrier": (
        "        if self.trainer.global_rank == 0:\n            self.trainer.strategy.barrier()\n",
        "self.trainer.strategy.barrier() runs only",
    ),
    "not_zero_strategy_reduce": (
        "        if not self.trainer.is_global_zero:\n"
        "            self.trainer.strategy.reduce(loss)\n",
        "strategy.reduce() runs only",
    ),
}


@pytest.mark.parametrize("name", sorted(LIGHTNING_FAULTS))
def test_lightning_collectives_under_a_rank_guard_are_errors(tmp_path, name):
    body, summary = LIGHTNING_FAULTS[name]
    found = findings(tmp_path, LIGHTNING_HEAD + body)
    assert [(r, line) for r, line, _ in found] == [(RULE, 11)], found
    assert summary in found[0][2]


def test_a_collective_in_a_rank_zero_only_function_is_an_error(tmp_path):
    text = LIGHTNING_HEAD + (
        "        return loss\n\n"
        "    @rank_zero_only\n"
        "    def report(self, value):\n"
        "        self.log('v', value, sync_dist=True)\n"
        "        torch.distributed.barrier()\n"
    )
    found = findings(tmp_path, text)
    assert lines_of(found) == [14, 15]
    assert "in a rank-zero-only function (line 13)" in found[0][2]


ACCELERATE_FAULTS = {
    "is_main_process_gather": "    if accelerator.is_main_process:\n        accelerator.gather(loss)\n",
    "local_main_reduce": "    if accelerator.is_local_main_process:\n        accelerator.reduce(loss)\n",
    "process_index_metrics": (
        "    if accelerator.process_index == 0:\n        accelerator.gather_for_metrics(loss)\n"
    ),
    "main_wait": "    if accelerator.is_main_process:\n        accelerator.wait_for_everyone()\n",
}


@pytest.mark.parametrize("name", sorted(ACCELERATE_FAULTS))
def test_accelerate_collectives_under_a_rank_guard_are_errors(tmp_path, name):
    found = findings(tmp_path, ACCELERATE_HEAD + ACCELERATE_FAULTS[name])
    assert lines_of(found) == [10], found


def test_accelerate_on_main_process_decorator_guards_a_collective(tmp_path):
    text = ACCELERATE_HEAD + (
        "\n\n@accelerator.on_main_process\ndef report(x):\n    accelerator.gather(x)\n"
    )
    assert lines_of(findings(tmp_path, text)) == [13]


HEALTHY_LIGHTNING = """
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import nn


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        if self.global_rank == 0:
            self.log("rank0_loss", loss, rank_zero_only=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = self.all_gather(self.layer(x))
        if self.trainer.is_global_zero:
            print(preds.shape)
        self.log("val_loss", nn.functional.cross_entropy(self.layer(x), y), sync_dist=True)

    def on_train_epoch_end(self):
        self.trainer.strategy.barrier()
        if self.trainer.is_global_zero:
            torch.save(self.state_dict(), "model.pt")

    @rank_zero_only
    def report(self, text):
        print(text)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1)
    trainer.fit(Model())
    if trainer.global_rank == 0:
        print("done")
"""

HEALTHY_ACCELERATE = """
import torch
from accelerate import Accelerator


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    losses = accelerator.gather_for_metrics(loss.detach())
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.print(losses.mean())
        unwrapped = accelerator.unwrap_model(model)
        accelerator.save(unwrapped.state_dict(), "model.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    "text", [HEALTHY_LIGHTNING, HEALTHY_ACCELERATE], ids=["lightning", "accelerate"]
)
def test_healthy_framework_scripts_as_the_docs_teach_get_nothing(tmp_path, text):
    assert findings(tmp_path, text) == []


def test_a_method_named_log_elsewhere_is_not_a_collective(tmp_path):
    text = """
    import logging

    class Job:
        def run(self, rank):
            if rank == 0:
                self.log("x", 1, sync_dist=True)
    """
    assert findings(tmp_path, text) == []


def test_a_validation_metric_synced_on_rank_0_alone_is_named_before_launch():
    """The framework corpus's lit_log_rank0.py: Lightning syncs this metric at the end of the
    validation epoch, where no frame of the user's code is on the stack; the preflight names its
    line before launch (and the run names it too: tests/integration/test_frameworks.py)."""
    path = CORPUS.parent / "frameworks" / "lit_log_rank0.py"
    findings = [f for f in check_scripts([str(path)]) if f.rule == RULE]
    assert [(f.line, f.severity) for f in findings] == [(23, Severity.ERROR)]
