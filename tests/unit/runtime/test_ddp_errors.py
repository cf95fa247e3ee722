"""DDP's reduction error named by the rank: indices turned into parameter names in DDP's order."""

from __future__ import annotations

from types import SimpleNamespace

import torch.nn as nn

from ddpdoctor.runtime import ddp_errors

MESSAGE = (
    "Expected to have finished reduction in the prior iteration before starting a new one. ...\n"
    "Parameter indices which did not receive grad for rank 0: 2 3\n"
    " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG ..."
)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)
        self.b = nn.Linear(2, 2)
        self.tied = self.a  # shared: once


def test_indices_are_read_from_the_reducer_message():
    assert ddp_errors.unused_indices(MESSAGE) == [2, 3]
    assert ddp_errors.unused_indices("Expected to have finished reduction") == []


def test_names_follow_ddps_order_without_frozen_ignored_or_shared_parameters():
    ddp = SimpleNamespace(module=Model(), parameters_to_ignore={"b.bias"})
    assert ddp_errors.reducer_names(ddp) == ["a.weight", "a.bias", "b.weight"]
    ddp = SimpleNamespace(module=Model(), parameters_to_ignore=set())
    names = ddp_errors.reducer_names(ddp)
    assert [names[i] for i in ddp_errors.unused_indices(MESSAGE)] == ["b.weight", "b.bias"]
