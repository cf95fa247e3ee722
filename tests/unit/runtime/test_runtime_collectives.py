"""Collective recording on a real single-process gloo group."""

from __future__ import annotations

import time
import warnings
from typing import Any, ClassVar

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import activate, deactivate
from ddpdoctor.runtime.c10d_hooks import GROUPS, OP_SPECS, WRAPPED_MARK
from ddpdoctor.runtime.collectives import TensorSummary
from tests.runtime_helpers import events, wait_until

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def every_op(t):
    """One call of every communication function torch 2.14 has (p2p needs a peer: integration)."""
    z = torch.zeros(4)
    return {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t]),
        "all_gather": lambda: dist.all_gather([torch.zeros(4)], t),
        "all_gather_coalesced": lambda: dist.all_gather_coalesced([[torch.zeros(4)]], [t]),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(z, t),
        "all_gather_single": lambda: dist.all_gather_single(z, t),
        "_all_gather_base": lambda: dist._all_gather_base(z, t),
        "all_gather_object": lambda: dist.all_gather_object([None], {"a": 1}),
        "all_to_all": lambda: dist.all_to_all([torch.zeros(4)], [t]),
        "all_to_all_single": lambda: dist.all_to_all_single(z, t),
        "barrier": lambda: dist.barrier(),
        "monitored_barrier": lambda: dist.monitored_barrier(),
        "broadcast": lambda: dist.broadcast(t, 0),
        "broadcast_object_list": lambda: dist.broadcast_object_list([1, 2], 0),
        "gather": lambda: dist.gather(t, [torch.zeros(4)], 0),
        "gather_into_tensor": lambda: dist.gather_into_tensor(t, z, 0),
        "gather_single": lambda: dist.gather_single(t, z, 0),
        "gather_object": lambda: dist.gather_object(1, [None], 0),
        "reduce": lambda: dist.reduce(t, 0),
        "reduce_scatter": lambda: dist.reduce_scatter(z, [t]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(z, t),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(z, t),
        "_reduce_scatter_base": lambda: dist._reduce_scatter_base(z, t),
        "scatter": lambda: dist.scatter(z, [t], 0),
        "scatter_object_list": lambda: dist.scatter_object_list([None], [1], 0),
    }


def test_every_collective_is_recorded_once_with_its_seq(recording):
    t = torch.ones(4)
    ops = {name: call for name, call in every_op(t).items() if hasattr(dist, name)}
    failed = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation warnings of the old spellings
        for name, call in ops.items():
            try:
                call()
            except RuntimeError:
                failed.add(name)  # gloo lacks gather_single; the failure is recorded too
    starts = events(recording, "collective_start")
    ends = events(recording, "collective_end")
    # exactly one start per call, in order: inner calls (the all_gather inside
    # all_gather_object, the gather_single inside gather_into_tensor) are not counted
    assert [e["op"] for e in starts] == list(ops)
    assert [e["seq"] for e in starts] == list(range(1, len(ops) + 1))
    assert {e["group"] for e in starts} == {"default"}
    assert [(e["op"], e["seq"]) for e in ends] == [(e["op"], e["seq"]) for e in starts]
    for end in ends:
        assert end["ok"] is (end["op"] not in failed), end
        assert end["duration_s"] >= 0
        if not end["ok"]:
            assert "does not support" in end["error"]
    assert failed <= {"gather_single", "gather_into_tensor"}
    by_op = {e["op"]: e for e in starts}
    assert by_op["all_reduce"]["shapes"] == [[4]]
    assert by_op["all_reduce"]["dtypes"] == ["float32"]
    assert by_op["all_reduce"]["numel"] == 4
    assert by_op["all_reduce"]["group_size"] == 1
    assert by_op["all_reduce"]["async"] is False
    assert by_op["barrier"]["shapes"] == [] and by_op["barrier"]["numel"] is None
    assert by_op["all_gather_object"]["numel"] is None


def test_patched_where_user_and_torch_code_look(recording):
    from torch.distributed import distributed_c10d as c10d

    for spec in OP_SPECS:
        if hasattr(c10d, spec.name):
            assert hasattr(getattr(c10d, spec.name), WRAPPED_MARK), spec.name
            if hasattr(dist, spec.name):
                assert getattr(dist, spec.name) is getattr(c10d, spec.name)


def test_deactivate_restores_the_real_functions(tmp_path, monkeypatch, world):
    monkeypatch.setenv("RANK", "0")
    activate(tmp_path / "run")
    assert hasattr(dist.all_reduce, WRAPPED_MARK)
    deactivate()
    assert not hasattr(dist.all_reduce, WRAPPED_MARK)
    assert not hasattr(dist.barrier, WRAPPED_MARK)
    dist.all_reduce(torch.ones(2))  # still works, unrecorded


def test_async_ops_end_when_their_work_completes(recording):
    t = torch.ones(8)
    work = dist.all_reduce(t, async_op=True)
    barrier = dist.barrier(async_op=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future = dist.all_reduce_coalesced([t], async_op=True)
    work.wait()
    barrier.wait()
    future.wait()
    wait_until(lambda: len(events(recording, "collective_end")) == 3)
    starts = events(recording, "collective_start")
    assert [s["async"] for s in starts] == [True, True, True]
    ends = {e["seq"]: e for e in events(recording, "collective_end")}
    assert all(e["ok"] and e["via"] == "future" for e in ends.values())
    assert recording.collectives.oldest_open() is None


def test_subgroups_are_named_and_numbered_apart(recording):
    group = dist.new_group([0])
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(2), group=group)
    dist.all_reduce(torch.ones(2), group=group)
    starts = events(recording, "collective_start")
    assert [(s["group"] == "default", s["seq"]) for s in starts] == [
        (True, 1),
        (False, 1),
        (False, 2),
    ]
    assert starts[1]["group_ranks"] == [0]
    assert starts[1]["group"] == starts[2]["group"] == str(group.group_name)
    assert recording.collectives.last_seqs()["default"] == 1


def test_a_rank_outside_the_group_records_nothing(recording):
    from torch.distributed import distributed_c10d as c10d

    assert GROUPS.describe(c10d.GroupMember.NON_GROUP_MEMBER) is None
    with pytest.warns(UserWarning, match="does not belong"):  # torch returns at once
        dist.all_reduce(torch.ones(2), group=c10d.GroupMember.NON_GROUP_MEMBER)
    assert events(recording, "collective_start") == []


def test_blocking_time_counts_as_comm_wait_of_the_step(recording):
    recording.steps.on_forward(time.monotonic(), grad=True, synced=True, batch_size=2)
    dist.barrier()
    dist.all_reduce(torch.ones(2))
    recording.steps.flush()
    (step,) = events(recording, "step")
    durations = sum(e["duration_s"] for e in events(recording, "collective_end"))
    assert step["comm_wait_s"] == pytest.approx(durations, abs=5e-3)


class SeesTheFile(torch.Tensor):
    """A tensor that reads the event file when torch.distributed's own code first touches it:
    that is, after ddpdoctor's hook ran and before the collective itself."""

    path: ClassVar[Any] = None
    seen: ClassVar[list[bytes]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "all_reduce" and not cls.seen:
            cls.seen.append(cls.path.read_bytes())
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_collectives_start_is_on_disk_before_it_is_entered(recording):
    recording.heartbeat.stop()  # nothing else writes the queue in this test
    recording.collectives.start(  # a gradient bucket: waits in the queue
        "all_reduce", GROUPS.describe(None), TensorSummary(((6,),), ("float32",), 6),
        is_async=True, bucket=0,
    )  # fmt: skip
    SeesTheFile.path = recording.run_dir.events_file(0)
    SeesTheFile.seen = []
    dist.all_reduce(torch.ones(10).as_subclass(SeesTheFile))
    (before,) = SeesTheFile.seen
    on_disk = [parse_event_line(line) for line in before.splitlines()]
    starts = [(e["op"], e["seq"], e.get("bucket"), e["shapes"]) for e in on_disk[-2:]]
    # the queue went out first (order kept), then the call's own start, with its shape
    assert starts == [("all_reduce", 1, 0, [[6]]), ("all_reduce", 2, None, [[10]])]
    assert "collective_end" not in [e["kind"] for e in on_disk]


def test_repeated_calls_keep_their_own_shapes(recording):
    for n in (3, 5, 3, 5):
        dist.all_reduce(torch.ones(n))
    dist.all_reduce(torch.ones(3, dtype=torch.float64))
    dist.all_reduce(torch.ones(3), async_op=True).wait()
    starts = events(recording, "collective_start")
    assert [(e["shapes"], e["dtypes"], e["async"]) for e in starts] == [
        ([[3]], ["float32"], False),
        ([[5]], ["float32"], False),
        ([[3]], ["float32"], False),
        ([[5]], ["float32"], False),
        ([[3]], ["float64"], False),
        ([[3]], ["float32"], True),
    ]
    assert [e["seq"] for e in starts] == [1, 2, 3, 4, 5, 6]
