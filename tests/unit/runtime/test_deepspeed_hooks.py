"""DeepSpeed's pipeline engine: each `train_batch()` is one step, whatever DataLoader feeds its
micro-batches, and `eval_batch()` an evaluation between steps (an engine of the same shape as
`deepspeed.runtime.pipe.engine.PipelineEngine`: importing DeepSpeed takes seconds)."""

from __future__ import annotations

import pytest

from ddpdoctor.runtime import deepspeed_hooks
from tests.runtime_helpers import events

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class RepeatingLoader:  # deepspeed.utils.RepeatingLoader: restarts its loader when it ends
    def __init__(self, loader):
        self.loader, self.data_iter = loader, iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


def pipeline_engine_class():
    """A stage that runs its micro-batches inside train_batch / eval_batch, as DeepSpeed's does:
    from the loader of `training_data=` when given no iterator, else from the script's."""

    class PipelineEngine:
        training = True
        micro_batches = 4
        stage_id, num_stages = 1, 2

        def __init__(self, loader):
            self.training_dataloader = RepeatingLoader(loader)
            self.layer = torch.nn.Linear(8, 1)
            self.optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.01)

        def train_micro_batch_size_per_gpu(self):
            return 2

        def _run(self, data_iter, grad):
            with torch.set_grad_enabled(grad):
                for _ in range(self.micro_batches):
                    x, y = next(data_iter or self.training_dataloader)
                    loss = (self.layer(x).squeeze(1) - y).pow(2).mean()
                    if grad:
                        loss.backward()
            if grad:  # the engine steps the torch optimizer it was given, once per batch
                self.optimizer.step()
                self.optimizer.zero_grad()
            return loss.detach()

        def train_batch(self, data_iter=None):
            return self._run(data_iter, True)

        def eval_batch(self, data_iter, return_logits=False):
            return self._run(data_iter, False)

    return PipelineEngine


def loader(n=64):
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.randn(n)), batch_size=2)


@pytest.mark.parametrize("own_iterator", [False, True], ids=["training_data", "RepeatingLoader"])
def test_each_train_batch_is_one_step_with_its_fetches_as_data_time(recording, own_iterator):
    cls = pipeline_engine_class()
    deepspeed_hooks.wrap_pipe_batch(recording, cls, "train_batch", True)
    deepspeed_hooks.wrap_pipe_batch(recording, cls, "eval_batch", False)
    engine = cls(loader())
    train_iter = RepeatingLoader(loader()) if own_iterator else None
    eval_iter = RepeatingLoader(loader(16))
    for step in range(6):
        engine.train_batch(train_iter) if own_iterator else engine.train_batch()
        assert recording.steps.current == step + 1
        if step % 3 == 2:
            engine.eval_batch(eval_iter)
    recording.steps.flush()
    steps = events(recording, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(s["batch_size"] == 8 and s["forwards"] == 1 for s in steps), steps
    assert all(s["data_time_s"] > 0 for s in steps), steps
    phases = [p["phase"] for p in events(recording, "phase")]
    assert phases == ["train", "eval", "train", "eval"]
    assert not recording.steps.in_batch


def test_a_train_batch_that_raises_leaves_later_fetches_to_open_iterations(recording):
    cls = pipeline_engine_class()
    deepspeed_hooks.wrap_pipe_batch(recording, cls, "train_batch", True)
    engine = cls(loader())
    engine.micro_batches = "not a count"  # range() raises inside the batch
    with pytest.raises(TypeError):
        engine.train_batch()
    assert not recording.steps.in_batch
    assert recording.steps.current == 1


def test_the_first_batch_writes_the_engines_stage_as_a_pipeline_event(recording):
    # the straggler rule compares a pipeline rank only with its own stage, a hang names it
    cls = pipeline_engine_class()
    deepspeed_hooks.wrap_pipe_batch(recording, cls, "train_batch", True)
    deepspeed_hooks.wrap_pipe_batch(recording, cls, "eval_batch", False)
    engine = cls(loader())
    engine.eval_batch(RepeatingLoader(loader(16)))
    for _ in range(3):
        engine.train_batch()
    (pipeline,) = events(recording, "pipeline")
    assert pipeline["stages"] == [1] and pipeline["num_stages"] == 2
    assert pipeline["microbatches"] == 4
    from ddpdoctor.monitor.model.pipeline_view import from_event

    view = from_event(pipeline, None)
    assert view.stages == (1,) and view.stage_text() == "stage 1/2"
