"""FSDP2 under the runtime, on a one-rank gloo group: the fully_shard line kept per unit, the
units' site text, the contract of the root, and the root's forwards counted as steps."""

from __future__ import annotations

import pytest

from ddpdoctor.runtime import fsdp_hooks
from tests.runtime_helpers import events

torch = pytest.importorskip("torch")
nn = torch.nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    model = Net()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)  # the units' line
    fully_shard(model, mesh=mesh)  # the root's line
    return model


def test_units_keep_their_fully_shard_line_and_the_root_forward_counts_steps(recording):
    model = build()
    here = __file__
    block_site = model.blocks[0].__dict__[fsdp_hooks.SITE_ATTR]
    root_site = model.__dict__[fsdp_hooks.SITE_ATTR]
    assert block_site[0] == here and block_site[1] + 1 == root_site[1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    recording.steps.flush()
    assert [s["step"] for s in events(recording, "step")] == [1, 2, 3]
    assert [s["batch_size"] for s in events(recording, "step")] == [2, 2, 2]
    state = model._get_fsdp_state()
    contract = fsdp_hooks.contract_of_root(state, model)
    keys = [key for key, _, _ in contract]
    assert keys[:3] == ["unit (root)", "unit blocks.0", "unit blocks.1"]
    assert block_site[2] == "build"
    assert ("param blocks.1.weight", "[4, 4] float32 grad", block_site) in contract
    assert dict((k, w) for k, _, w in contract)["param head.bias"] == root_site


def test_a_units_site_names_its_module_and_line_once():
    text = fsdp_hooks.unit_text("blocks.1", ("/src/train.py", 67, "main"))
    assert '"unit":{"module":"blocks.1","file":"/src/train.py","line":67}' in text
    assert '"function":"fully_shard[blocks.1]"' in text
    assert fsdp_hooks.unit_text("", None) == '"unit":{"module":"(root)"}'
