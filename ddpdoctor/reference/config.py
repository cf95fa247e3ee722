"""The reference job's command line: `python -m ddpdoctor.reference [OPTIONS]`.

Defaults are picked for a 2-core CPU: a small CNN, 40 steps of 32 samples per rank, no DataLoader
worker processes (forking workers costs more than it saves on tiny batches). On a GPU the job
trains resnet18 with SyncBatchNorm and a few loader workers, as the DDP tutorials do.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from ddpdoctor.errors import UsageError
from ddpdoctor.reference.inject import InjectSpec, parse_inject

DEFAULT_STEPS = 40
DEFAULT_BATCH_SIZE = 32
DEFAULT_LOG_EVERY = 10
MODELS = ("cnn", "resnet18")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class ReferenceConfig:
    steps: int = DEFAULT_STEPS
    model: str | None = None  # None: cnn on CPU, resnet18 on GPU
    data: str | None = None  # a CIFAR-10 folder (torchvision layout); None: synthetic data
    batch_size: int = DEFAULT_BATCH_SIZE
    workers: int | None = None  # None: 0 on CPU, 2 on GPU
    backend: str = "auto"
    injects: tuple[InjectSpec, ...] = ()
    seed: int = 0
    lr: float = 0.01
    log_every: int = DEFAULT_LOG_EVERY
    train_samples: int = 2048  # synthetic set sizes
    test_samples: int = 512

    def model_for(self, on_gpu: bool) -> str:
        return self.model or ("resnet18" if on_gpu else "cnn")

    def workers_for(self, on_gpu: bool) -> int:
        if self.workers is not None:
            return self.workers
        return 2 if on_gpu else 0

    def backend_for(self, on_gpu: bool) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if on_gpu else "gloo"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"reference job: {message}")


def _at_least(minimum: int):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ddpdoctor.reference",
        description="The ddpdoctor reference DDP job (run it under torchrun).",
    )
    p.add_argument("--steps", type=_at_least(1), default=DEFAULT_STEPS)
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--data", metavar="DIR", help="CIFAR-10 folder (no download)")
    p.add_argument("--batch-size", type=_at_least(1), default=DEFAULT_BATCH_SIZE)
    p.add_argument("--workers", type=_at_least(0), help="DataLoader workers per rank")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--inject", action="append", default=[], metavar="SPEC")
    p.add_argument("--seed", type=_at_least(0), default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--log-every", type=_at_least(1), default=DEFAULT_LOG_EVERY)
    p.add_argument("--train-samples", type=_at_least(16), default=2048)
    p.add_argument("--test-samples", type=_at_least(16), default=512)
    return p


def parse_config(argv: Sequence[str]) -> ReferenceConfig:
    """The config from a command line; every mistake is a UsageError (one line, exit 2)."""
    ns = build_parser().parse_args(list(argv))
    return ReferenceConfig(
        steps=ns.steps,
        model=ns.model,
        data=ns.data,
        batch_size=ns.batch_size,
        workers=ns.workers,
        backend=ns.backend,
        injects=tuple(parse_inject(text) for text in ns.inject),
        seed=ns.seed,
        lr=ns.lr,
        log_every=ns.log_every,
        train_samples=ns.train_samples,
        test_samples=ns.test_samples,
    )


def reference_argv(
    *,
    steps: int | None = None,
    model: str | None = None,
    data: str | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
    backend: str = "auto",
    injects: Sequence[InjectSpec] = (),
) -> list[str]:
    """The inverse of parse_config for what `ddpdoctor run` passes on (None: the job's default)."""
    argv: list[str] = []
    if steps is not None:
        argv += ["--steps", str(steps)]
    if model is not None:
        argv += ["--model", model]
    if data is not None:
        argv += ["--data", data]
    if batch_size is not None:
        argv += ["--batch-size", str(batch_size)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv += ["--backend", backend]
    for spec in injects:
        argv += ["--inject", spec.text]
    return argv
