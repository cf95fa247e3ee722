"""The SPMD contract's comparison (ddpdoctor/runtime/fingerprint.py) on a real TCPStore: the last
rank to arrive compares, names the first differing entry, its line and the culprit."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.nn as nn

from ddpdoctor.runtime import fingerprint

HERE = ("/src/train.py", 12, "main")
WRAP = ("/src/train.py", 20, "main")


@pytest.fixture
def stores():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    clients = [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
        for _ in range(3)
    ]
    yield clients
    del clients, server


def entries(model: nn.Module) -> list[fingerprint.Entry]:
    return fingerprint.param_entries(model.named_parameters(), lambda _name: HERE)


def run(stores, contracts, label="m1"):
    """Every rank publishes in order; the last one's answer."""
    out = None
    for rank, contract in enumerate(contracts):
        out = fingerprint.exchange_on(
            stores[rank], rank, range(len(contracts)), label, "the model", contract, 5.0
        )
        if rank < len(contracts) - 1:
            assert out is None  # only the last to arrive compares
    return out


def test_entries_name_shape_dtype_and_whether_it_trains():
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    assert entries(model) == [
        ("param weight", "[2, 3] float32 grad", HERE),
        ("param bias", "[2] float32 frozen", HERE),
    ]


def test_same_contracts_say_nothing(stores):
    model = nn.Linear(3, 2)
    assert run(stores[:2], [entries(model), entries(model)]) is None


def test_a_frozen_parameter_on_one_of_two_ranks_blames_the_rank_that_froze_it(stores):
    healthy, frozen = nn.Linear(3, 2), nn.Linear(3, 2)
    frozen.bias.requires_grad_(False)
    message = run(stores[:2], [entries(healthy), entries(frozen)])
    assert message is not None
    assert "param bias: rank 1 [2] float32 frozen, rank 0 [2] float32 grad" in message
    assert message.endswith("[culprits 1; line /src/train.py:12; t 5.000]")
    # the other way round: still the rank that froze it
    message = run(stores[:2], [entries(frozen), entries(healthy)], label="m2")
    assert message is not None and "[culprits 0;" in message


def test_an_extra_unit_blames_the_rank_that_has_it_and_a_majority_wins(stores):
    base = [("unit (root)", "cpu mesh [3] dims -", WRAP)]
    extra = [*base, ("unit head", "cpu mesh [3] dims -", ("/src/train.py", 21, "main"))]
    message = run(stores, [base, extra, base])
    assert message is not None and "rank 1 has unit head" in message
    assert "[culprits 1; line /src/train.py:21;" in message
    message = run(stores[:2], [extra, base], label="m2")
    assert message is not None and "[culprits 0;" in message


def test_a_shape_difference_between_two_ranks_names_both(stores):
    message = run(stores[:2], [entries(nn.Linear(3, 2)), entries(nn.Linear(3, 4))])
    assert message is not None and "[culprits 0,1;" in message


def test_contract_text_round_trips_through_the_store_encoding(stores):
    contract = [*entries(nn.Linear(2, 2)), ("mesh", "cpu mesh [2] dims dp", None)]
    stores[0].set("k", fingerprint.encode(contract))
    assert fingerprint._entries(stores[0], "k") == contract


def test_a_group_of_ranks_compares_apart_and_names_its_global_ranks(stores):
    healthy, frozen = nn.Linear(3, 2), nn.Linear(3, 2)
    frozen.weight.requires_grad_(False)
    members = [1, 3]  # one data-parallel group of two: global ranks 1 and 3
    first = fingerprint.exchange_on(stores[0], 1, members, "g", "m", entries(healthy), 0.0)
    last = fingerprint.exchange_on(stores[1], 3, members, "g", "m", entries(frozen), 0.0)
    assert first is None and last is not None
    assert "rank 3 [2, 3] float32 frozen, rank 1" in last and "[culprits 3;" in last


def test_a_unit_one_rank_alone_wrapped_is_named_before_the_parent_count_it_changes(stores):
    """Rank 1's extra fully_shard moves the head's parameters out of the root: the root's count
    differs first in the list, but the cause is the unit only rank 1 has, at its own line."""
    head = ("/src/train.py", 46, "shard")
    rank0 = [("unit (root)", "cpu mesh [2] dims -, 3 parameters", WRAP)]
    rank1 = [
        ("unit (root)", "cpu mesh [2] dims -, 1 parameters", WRAP),
        ("unit output", "cpu mesh [2] dims -, 2 parameters", head),
    ]
    message = run(stores[:2], [rank0, rank1])
    assert message is not None and "rank 1 has unit output" in message
    assert "[culprits 1; line /src/train.py:46;" in message
    message = run(stores[:2], [rank1, rank0], label="m2")
    assert message is not None and "[culprits 0; line /src/train.py:46;" in message


def test_a_unit_that_takes_the_roots_last_parameters_is_the_cause_not_a_tie(stores):
    """Rank 1 alone wraps the head, the only parameters the root held itself: its root has no
    unit left (FSDP makes none without parameters). The root's absence follows from the wrap:
    rank 1 is the culprit, at the head's line (it was a tie naming both ranks)."""
    head = ("/src/train.py", 69, "main")
    block = ("unit blocks.0", "cpu mesh [2] dims shard, 2 parameters", WRAP)
    rank0 = [block, ("unit (root)", "cpu mesh [2] dims shard, 2 parameters", WRAP)]
    rank1 = [block, ("unit head", "cpu mesh [2] dims shard, 2 parameters", head)]
    message = run(stores[:2], [rank0, rank1])
    assert message is not None and "rank 1 has unit head" in message, message
    assert "[culprits 1; line /src/train.py:69;" in message
    message = run(stores[:2], [rank1, rank0], label="m2")
    assert message is not None and "[culprits 0; line /src/train.py:69;" in message


def test_a_true_tie_names_both_sides_and_says_why(stores):
    message = run(stores[:2], [entries(nn.Linear(3, 2)), entries(nn.Linear(3, 4))])
    assert message is not None and "nothing tells which one left: both named" in message
