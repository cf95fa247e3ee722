"""Point-to-point calls as events: the peer's global rank (also for group_dst / group_src),
the tag, the ops of a batch (c10d_hooks.py, records.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ddpdoctor.runtime.call_args import batch_parts, global_rank
from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary
from ddpdoctor.runtime.patching import WRAPPED_MARK
from ddpdoctor.runtime.records import CollectiveDesc

SUB = GroupInfo("pp", 2, (2, 3))


def start_fields(desc: CollectiveDesc) -> dict:
    return json.loads("{" + desc.start_tail + "}")


def test_a_group_rank_is_made_global_and_world_ranks_stay():
    assert global_rank(SUB, 1) == 3
    assert global_rank(GroupInfo(), 1) == 1
    assert global_rank(SUB, 7) == 7  # out of range: kept as given


def test_a_batch_lists_its_ops_with_global_peers_and_tags():
    def isend(): ...

    def irecv(): ...

    wrapped = SimpleNamespace(__name__="recorded")  # the runtime's wrapper names the real one
    setattr(wrapped, WRAPPED_MARK, irecv)
    ops = [
        SimpleNamespace(op=isend, peer=3, tag=0),
        SimpleNamespace(op=wrapped, peer=1, tag=7),
        SimpleNamespace(op=isend, peer=None, tag=0),  # an odd op: left out
    ]
    assert batch_parts(ops) == (("isend", 3, 0), ("irecv", 1, 7))


def test_the_start_event_carries_peer_tag_and_batch_ops():
    send = CollectiveDesc("isend", SUB, TensorSummary(), is_async=True, p2p=True, peer=3, tag=5)
    fields = start_fields(send)
    assert (fields["p2p"], fields["peer"], fields["tag"]) == (True, 3, 5)
    batch = CollectiveDesc(
        "batch_isend_irecv",
        SUB,
        TensorSummary(),
        is_async=True,
        p2p=True,
        parts=(("isend", 3, 0), ("irecv", 2, 0)),
    )
    fields = start_fields(batch)
    assert fields["peer"] is None and fields["p2p_ops"] == [["isend", 3, 0], ["irecv", 2, 0]]
    plain = CollectiveDesc("all_reduce", SUB, TensorSummary(), is_async=False)
    assert "tag" not in start_fields(plain) and "p2p_ops" not in start_fields(plain)
