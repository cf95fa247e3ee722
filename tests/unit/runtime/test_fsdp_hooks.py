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


class Group:
    """What ran_from_text reads of an FSDPParamGroup: its module's name and its modules."""

    def __init__(self, wrapped_at) -> None:
        self._module_fqn = "blocks.1"
        module = nn.Linear(2, 2)
        module.__dict__[fsdp_hooks.SITE_ATTR] = wrapped_at
        self.modules = (module,)


def ran_here(group):
    import sys

    return fsdp_hooks.ran_from_text(group, sys._getframe()), sys._getframe().f_lineno


def test_a_units_all_gather_names_the_user_line_that_ran_it():
    """The unit's all-gather carries the user's line that ran it (here: ran_here's own line),
    via fully_shard[<unit>] at its wrapping line; the text is made once per (unit, line)."""
    import json

    group = Group(("/src/train.py", 67, "main"))
    text, line = ran_here(group)
    assert text is not None
    fields = json.loads("{" + text + "}")
    assert fields["site"]["file"] == __file__ and fields["site"]["line"] == line
    assert fields["site"]["function"] == "ran_here"
    assert fields["site"]["via"] == {
        "file": "train.py",
        "line": 67,
        "function": "fully_shard[blocks.1]",
    }
    assert fields["unit"] == {"module": "blocks.1", "file": "/src/train.py", "line": 67}
    assert ran_here(group)[0] is text  # made once per (unit, line)
    # ran_here is a helper: the user's line that called it (this test) is named too
    caller = fields["site"]["caller"]
    assert caller["file"] == __file__ and caller["function"].startswith("test_a_units_all")


def ran_the_unit_in_a_helper(group):
    return ran_here(group)


def test_a_unit_run_in_a_helper_names_the_helpers_caller():
    import json

    text, line = ran_the_unit_in_a_helper(Group(("/src/train.py", 67, "main")))
    site = json.loads("{" + text + "}")["site"]
    assert site["line"] == line and site["function"] == "ran_here"
    assert site["caller"]["function"] == "ran_the_unit_in_a_helper"
    assert site["caller"]["line"] == ran_the_unit_in_a_helper.__code__.co_firstlineno + 1


def test_fully_shard_imported_before_the_runtime_still_names_its_line(recording):
    """A script holding the unwrapped fully_shard (imported before the runtime started): its
    state's init still records the line."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard import _fully_shard as impl

    original = getattr(impl.fully_shard, "__wrapped__", impl.fully_shard)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    block = nn.Linear(4, 4)
    original(block, mesh=mesh)  # the line
    where = block.__dict__[fsdp_hooks.SITE_ATTR]
    assert (
        where[0] == __file__
        and where[2] == "test_fully_shard_imported_before_the_runtime_still_names_its_line"
    )
