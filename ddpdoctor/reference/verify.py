"""After training: the checkpoint round trip, the evaluation, and the cross-rank parameter check.

Each is a DDP habit worth proving on a new machine: rank 0 alone saves `model.module.state_dict()`
(no `module.` prefix, loadable into a bare model) while the others wait at a barrier; evaluation
splits the test set across ranks and gathers per-rank metrics with `all_gather_object`; and at the
end every rank must hold bit-identical parameters, or DDP's gradient averaging was broken.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.protocol.rundir import make_private_dirs, open_private

CHECKPOINT_NAME = "reference-model.pt"


@dataclass(frozen=True)
class EvalResult:
    samples: int
    correct: int
    loss: float
    per_rank_samples: tuple[int, ...]

    @property
    def accuracy(self) -> float:
        return self.correct / self.samples if self.samples else 0.0


@dataclass(frozen=True)
class ParamCheck:
    digests: tuple[str, ...]  # one per rank, in rank order

    @property
    def identical(self) -> bool:
        return len(set(self.digests)) == 1

    def differing_ranks(self) -> tuple[int, ...]:
        """Ranks whose parameters differ from rank 0's."""
        return tuple(r for r, d in enumerate(self.digests) if d != self.digests[0])


def checkpoint_dir(run_dir: str | None) -> tuple[Path, bool]:
    """(folder, temporary?): RUN_DIR/checkpoint under ddpdoctor, else a temp folder removed after."""
    if run_dir:
        return Path(run_dir) / "checkpoint", False
    return Path(tempfile.mkdtemp(prefix="ddpdoctor-reference-")), True


def save_checkpoint(
    ddp_model: Any, directory: Path | None, fresh_model: Callable[[], Any]
) -> Path | None:
    """The rank given a directory (rank 0) saves and reloads the bare model's weights; every rank
    then meets at a barrier."""
    import torch
    import torch.distributed as dist

    path = None
    if directory is not None:
        state = ddp_model.module.state_dict()
        prefixed = [k for k in state if k.startswith("module.")]
        if prefixed:
            raise RuntimeError(f"checkpoint keys carry the DDP prefix: {prefixed[:3]}")
        make_private_dirs(directory)
        path = directory / CHECKPOINT_NAME
        tmp = path.with_name(f".{path.name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of an earlier try: open_private creates, never truncates
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
            torch.save(state, fh)  # 0600, like every file of the run directory
        os.replace(tmp, path)
        # The round trip a later load would do: strict, into a model without the DDP wrapper.
        fresh_model().load_state_dict(torch.load(path, weights_only=True), strict=True)
    dist.barrier()
    return path


def remove_checkpoint_dir(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def evaluate(model: Any, test_set: Any, *, device: Any, batch_size: int) -> EvalResult:
    """Each rank scores its share of the test set; the totals come from all_gather_object."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    sampler: DistributedSampler = DistributedSampler(test_set, shuffle=False)
    loader = DataLoader(test_set, batch_size=batch_size, sampler=sampler)
    samples = correct = 0
    loss_sum = 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
            samples += int(labels.numel())
    model.train(was_training)
    mine = {"samples": samples, "correct": correct, "loss_sum": loss_sum}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    total = sum(g["samples"] for g in gathered)
    return EvalResult(
        samples=total,
        correct=sum(g["correct"] for g in gathered),
        loss=sum(g["loss_sum"] for g in gathered) / max(total, 1),
        per_rank_samples=tuple(g["samples"] for g in gathered),
    )


def parameters_digest(model: Any) -> str:
    """sha256 over every parameter's name and float32 bytes, in module order."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        h.update(name.encode())
        h.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_parameters(model: Any) -> ParamCheck:
    import torch.distributed as dist

    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, parameters_digest(model))
    return ParamCheck(digests=tuple(str(d) for d in digests))
