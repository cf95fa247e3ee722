"""Steps however a framework drives DDP: confirmed by an optimizer step, a gradient bucket or
train mode, never by `module.training` alone; Lightning's and the HF Trainer's phases and epochs."""

from __future__ import annotations

import pytest

from ddpdoctor.runtime import records
from ddpdoctor.runtime.steps import StepTracker
from tests.runtime_helpers import events

torch = pytest.importorskip("torch")
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def tracker():
    emitted: list[dict] = []
    clock = [0.0]
    steps = StepTracker(lambda record: emitted.append(records.as_event(record)), lambda: clock[0])
    return steps, emitted, clock


def test_an_eval_mode_forward_with_grad_counts_once_its_optimizer_steps():
    # Lightning: the DDP wrapper stays in eval mode; its forward runs inside optimizer.step
    steps, emitted, _ = tracker()
    for i in range(3):
        steps.on_fetch(i, i + 0.1, exhausted=False, epoch=0)
        steps.on_forward(i + 0.1, grad=True, synced=True, batch_size=4, train_mode=False)
        assert steps.current == i + 1
        steps.on_optimizer_step()
    steps.on_fetch(3.0, 3.1, exhausted=True, epoch=None)
    assert [e["step"] for e in emitted] == [1, 2, 3]
    assert [e["step_time_s"] for e in emitted] == [1.0, 1.0, 1.0]
    assert all(e["epoch"] == 0 and e["batch_size"] == 4 for e in emitted)


def test_a_forward_with_grad_that_nothing_confirms_is_not_a_step():
    # a validation loss computed in eval mode without no_grad, no optimizer step
    steps, emitted, clock = tracker()
    steps.on_fetch(0.0, 0.1, exhausted=False, epoch=0)
    steps.on_forward(0.1, grad=True, synced=True, batch_size=4, train_mode=False)
    clock[0] = 0.5
    steps.flush()  # not confirmed: stays open (its optimizer step may be about to come)
    steps.on_fetch(1.0, 1.1, exhausted=False, epoch=0)
    steps.on_forward(1.1, grad=True, synced=True, batch_size=4, train_mode=False)
    steps.on_forward(1.2, grad=True, synced=True, batch_size=4, train_mode=False)
    steps.on_fetch(2.0, 2.0, exhausted=True, epoch=None)
    assert emitted == [] and steps.steps_done == 0


def test_train_mode_confirms_at_once_and_no_grad_forwards_are_evaluation():
    steps, emitted, _ = tracker()
    steps.on_forward(0.0, grad=True, synced=True, batch_size=2)  # a plain loop, train mode
    steps.on_forward(1.0, grad=False, synced=False, batch_size=None)  # eval: closes step 1
    steps.on_forward(1.5, grad=False, synced=False, batch_size=None)
    steps.on_optimizer_step()  # no step is open: nothing to confirm
    steps.flush()
    assert [(e["step"], e["step_time_s"]) for e in emitted] == [(1, 1.0)]


def test_no_sync_forwards_accumulate_into_the_step_the_optimizer_confirms():
    steps, emitted, _ = tracker()
    steps.on_fetch(0.0, 0.1, exhausted=False, epoch=1)
    steps.on_forward(0.1, grad=True, synced=False, batch_size=4, train_mode=False)
    steps.on_fetch(0.5, 0.6, exhausted=False, epoch=1)
    steps.on_forward(0.6, grad=True, synced=True, batch_size=4, train_mode=False)
    steps.on_optimizer_step()
    steps.on_fetch(1.0, 1.1, exhausted=False, epoch=1)
    (step,) = emitted
    assert step["forwards"] == 2 and step["batch_size"] == 8 and step["step_time_s"] == 1.0


def test_a_gradient_bucket_confirms_the_step():
    steps, emitted, _ = tracker()
    steps.on_forward(0.0, grad=True, synced=True, batch_size=2, train_mode=False)
    token = steps.on_bucket_launch(0.2)
    steps.on_bucket_done(token, 0.3)
    steps.on_forward(1.0, grad=True, synced=True, batch_size=2, train_mode=False)
    assert [e["step"] for e in emitted] == [1]


def test_an_optimizer_step_without_a_ddp_forward_counts_the_fetched_iteration():
    # a model DDP does not wrap (or one process): the DataLoader and the optimizer mark steps
    steps, emitted, _ = tracker()
    for i in range(2):
        steps.on_fetch(i, i + 0.25, exhausted=False, epoch=0)
        steps.on_optimizer_step()
    steps.on_fetch(2.0, 2.0, exhausted=True, epoch=None)
    assert [(e["step"], e["data_time_s"]) for e in emitted] == [(1, 0.25), (2, 0.25)]


def test_without_ddp_a_loader_that_fetches_ahead_still_counts_every_optimizer_step():
    # accelerate's DataLoaderShard fetches one batch ahead: its last batch is trained after the
    # fetch that ended the epoch
    steps, emitted, _ = tracker()
    steps.on_fetch(0.0, 0.1, exhausted=False, epoch=0)
    steps.on_fetch(0.1, 0.2, exhausted=False, epoch=0)  # ahead
    steps.on_optimizer_step()  # batch 1
    steps.on_fetch(1.0, 1.1, exhausted=True, epoch=None)  # ahead: the end
    steps.on_optimizer_step()  # batch 2
    steps.on_fetch(2.0, 2.1, exhausted=False, epoch=1)
    assert [(e["step"], e["step_time_s"], e["epoch"]) for e in emitted] == [
        (1, 1.0, 0),
        (2, 1.0, 0),
    ]


def test_with_ddp_an_optimizer_step_outside_any_step_opens_none():
    steps, emitted, _ = tracker()
    steps.on_forward(0.0, grad=True, synced=True, batch_size=2)
    steps.flush()  # e.g. a phase change between backward and the optimizer step
    steps.on_optimizer_step()
    steps.on_fetch(1.0, 1.0, exhausted=True, epoch=None)
    assert [e["step"] for e in emitted] == [1]


# -- on a real DDP model, with the runtime's hooks ----------------------------------------------


def lightning_like_model():
    """DDP left in eval mode around a module that trains (as Lightning leaves it)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DDP(net)
    model.eval()
    net.train()
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def test_ddp_in_eval_mode_trained_by_an_optimizer_records_steps_in_phase_train(recording):
    model, optimizer = lightning_like_model()
    for _ in range(3):

        def closure():
            optimizer.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            return loss

        optimizer.step(closure)  # Lightning's way: the forward runs inside the step
    with torch.no_grad():
        model(torch.randn(4, 8))  # validation: closes the last step
    assert [s["step"] for s in events(recording, "step")] == [1, 2, 3]
    phases = [p["phase"] for p in events(recording, "phase")]
    assert phases == ["train", "eval"]


def test_ddp_eval_forwards_with_grad_and_no_optimizer_step_are_no_steps(recording):
    model, _ = lightning_like_model()
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).mean()  # a validation loss without no_grad
    recording.steps.flush()
    assert events(recording, "step") == []
    assert recording.steps.steps_done == 0


def test_lightning_fit_names_sanity_check_train_validate_and_epochs(recording):
    lightning = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(12, 4)), batch_size=4)
    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, num_sanity_val_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), data, data)
    phases = [p["phase"] for p in events(recording, "phase")]
    assert phases == ["sanity_check", "train", "validate", "train", "validate"]
    steps = events(recording, "step")
    # one process, no DDP: the fetches and the optimizer steps mark the steps
    assert [(s["step"], s["epoch"]) for s in steps] == [(i + 1, i // 3) for i in range(6)]
    assert recording.auto_phase is False


def test_hf_trainer_events_set_the_epoch_and_the_phases(recording):
    callbacks = pytest.importorskip("transformers.trainer_callback")
    handler = callbacks.CallbackHandler([], None, None, None, None)
    state, control = callbacks.TrainerState(), callbacks.TrainerControl()
    state.epoch = 2.9999999
    handler.on_epoch_begin(None, state, control)
    assert recording.steps.epoch == 3
    handler.on_step_begin(None, state, control)
    handler.on_step_begin(None, state, control)
    handler.on_prediction_step(None, state, control)
    handler.on_step_begin(None, state, control)
    assert [p["phase"] for p in events(recording, "phase")] == ["train", "eval", "train"]
    assert recording.auto_phase is True  # a script's own phase() still takes over


def test_the_framework_wrappers_come_out_with_the_runtime(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    from lightning.pytorch.trainer import call

    from ddpdoctor.runtime import deactivate
    from ddpdoctor.runtime.frameworks import WRAPPED_MARK
    from tests.runtime_helpers import start_recording

    original = call._call_callback_hooks
    assert not hasattr(original, WRAPPED_MARK)
    start_recording(tmp_path, monkeypatch)
    try:
        assert getattr(call._call_callback_hooks, WRAPPED_MARK) is original
    finally:
        deactivate()
    assert call._call_callback_hooks is original
