"""Training data for the reference job: CIFAR-10 from a folder, or a synthetic CIFAR-shaped set.

Nothing is ever downloaded at run time. Without `--data`, the job uses a deterministic synthetic set
(3×32×32 uint8 images, 10 classes): each class is a fixed random low-frequency colour pattern plus
per-image noise, so a small CNN's loss goes down within a few dozen steps. One process per node
(local rank 0) writes it to a cache file, or validates the copy already there, while the other ranks
wait; then every rank loads the same file. That is the rank-0-prepares-then-barrier pattern the DDP
tutorials teach, and it keeps every rank's data identical.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYNTHETIC_VERSION = 2
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
CACHE_ENV = "DDPDOCTOR_CACHE_DIR"
# Normalisation of the synthetic set (uint8 -> roughly zero mean, unit variance).
_MEAN, _STD = 0.5, 0.25
# torchvision's usual CIFAR-10 statistics for the real set.
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


@dataclass(frozen=True)
class SyntheticSpec:
    train_samples: int
    test_samples: int
    seed: int = 0

    @property
    def file_name(self) -> str:
        return (
            f"synthetic-cifar10-v{SYNTHETIC_VERSION}-seed{self.seed}"
            f"-{self.train_samples}-{self.test_samples}.pt"
        )


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """Where the synthetic set is kept: $DDPDOCTOR_CACHE_DIR, else the XDG cache, else /tmp."""
    env = dict(os.environ) if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddpdoctor"


def generate_synthetic(spec: SyntheticSpec) -> dict[str, Any]:
    """The synthetic set as uint8 images and int64 labels, identical for identical specs."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1000 + spec.seed)
    # Coarse 4x4 colour patterns blown up to 32x32: distinct per class, easy for a CNN.
    coarse = torch.rand(NUM_CLASSES, 3, 4, 4, generator=g)
    templates = F.interpolate(coarse, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False)

    def split(n: int) -> tuple[Any, Any]:
        labels = torch.randperm(n, generator=g) % NUM_CLASSES
        noise = torch.randn(n, *IMAGE_SHAPE, generator=g) * 0.5
        images = (0.25 + 0.5 * templates[labels] + noise).clamp(0.0, 1.0)
        return (images * 255).round().to(torch.uint8), labels.to(torch.int64)

    train_x, train_y = split(spec.train_samples)
    test_x, test_y = split(spec.test_samples)
    arrays = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
    return {**arrays, "digest": digest_of(arrays), "version": SYNTHETIC_VERSION}


def digest_of(arrays: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for key in ("train_x", "train_y", "test_x", "test_y"):
        h.update(key.encode())
        h.update(arrays[key].contiguous().numpy().tobytes())
    return h.hexdigest()


def validate_synthetic(path: Path, spec: SyntheticSpec) -> str | None:
    """None when the file holds the set `spec` describes, else what is wrong with it."""
    import torch

    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is simply regenerated
        return f"unreadable ({type(exc).__name__})"
    try:
        if data.get("version") != SYNTHETIC_VERSION:
            return "old version"
        if len(data["train_y"]) != spec.train_samples or len(data["test_y"]) != spec.test_samples:
            return "wrong size"
        if digest_of(data) != data.get("digest"):
            return "checksum mismatch"
    except (KeyError, AttributeError, TypeError):
        return "not a synthetic data file"
    return None


def prepare_synthetic(directory: Path, spec: SyntheticSpec) -> tuple[Path, str]:
    """Make sure `directory` holds a valid copy of the set: (path, "validated" | "generated")."""
    import torch

    path = directory / spec.file_name
    if path.exists() and validate_synthetic(path, spec) is None:
        return path, "validated"
    directory.mkdir(parents=True, exist_ok=True)
    data = generate_synthetic(spec)
    # Write then rename, so a rank on another node sharing this folder never reads half a file.
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.file_name}.", dir=directory)
    os.close(fd)
    try:
        torch.save(data, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path, "generated"


def load_synthetic(path: Path) -> tuple[Any, Any]:
    """(train, test) TensorDatasets of normalised float images, read from the prepared file."""
    import torch
    from torch.utils.data import TensorDataset

    data = torch.load(path, weights_only=True)

    def dataset(x: Any, y: Any) -> TensorDataset:
        return TensorDataset((x.float() / 255.0 - _MEAN) / _STD, y)

    return dataset(data["train_x"], data["train_y"]), dataset(data["test_x"], data["test_y"])


def load_cifar10(root: str) -> tuple[Any, Any]:
    """The real CIFAR-10 from `root` (torchvision layout); never downloads.

    torchvision checks the files' integrity when the dataset is built and raises
    "Dataset not found or corrupted" when they are missing or damaged.
    """
    import torchvision
    from torchvision import transforms

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(CIFAR_MEAN, CIFAR_STD)]
    )
    train = torchvision.datasets.CIFAR10(root, train=True, download=False, transform=transform)
    test = torchvision.datasets.CIFAR10(root, train=False, download=False, transform=transform)
    return train, test
