"""Models of the reference job: a small CNN (fast on a CPU) and torchvision's resnet18."""

from __future__ import annotations

from typing import Any

from ddpdoctor.reference.data import NUM_CLASSES


def build_model(name: str, *, sync_batchnorm: bool = False) -> Any:
    """A fresh model, seeded by the caller; `sync_batchnorm` converts BatchNorm for multi-GPU DDP."""
    import torch.nn as nn

    if name == "cnn":
        model = small_cnn()
    elif name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES)
    else:
        raise ValueError(f"unknown model {name!r}")
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def small_cnn() -> Any:
    """Two conv blocks and two linear layers (~137k parameters): one DDP gradient bucket."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 64),
        nn.ReLU(inplace=True),
        nn.Linear(64, NUM_CLASSES),
    )


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
