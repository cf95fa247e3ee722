"""torchft in a rank: the Manager makes the process a rank numbered as torchft numbers it, its
quorums are recorded when they change, and the collectives of its process groups are recorded
like torch.distributed's (the last test runs torchft's real ProcessGroupGloo)."""

from __future__ import annotations

import datetime
import types

import pytest

from ddpdoctor.protocol.replica_groups import group_index
from ddpdoctor.protocol.rundir import ENV_RUN_DIR
from ddpdoctor.runtime import core, deactivate, torchft_hooks
from tests.runtime_helpers import events, start_recording


def test_the_replica_group_is_the_trailing_digits_of_the_replica_id(monkeypatch):
    assert group_index("train_ddp_3:8e1f-uuid") == 3
    assert group_index("replica12") == 12
    assert group_index("no-digits") is None and group_index(None) is None
    assert torchft_hooks.global_rank("train_ddp_1", 1, 2) == (1, 3)
    monkeypatch.setenv("REPLICA_GROUP_ID", "2")
    assert torchft_hooks.global_rank(None, 0, 1) == (2, 2)  # the README's variable
    monkeypatch.delenv("REPLICA_GROUP_ID")
    assert torchft_hooks.global_rank("", 1, 4) == (0, 1)


def quorum(quorum_id, ids, **kw):
    kw.setdefault("heal", False)
    kw.setdefault("recover_dst_replica_ranks", [])
    return types.SimpleNamespace(
        quorum_id=quorum_id, replica_ids=ids, replica_rank=0,
        replica_world_size=len(ids), max_step=kw.pop("max_step", 5), **kw,
    )  # fmt: skip


class FakeClient:
    def __init__(self, answers):
        self.answers = list(answers)

    def _quorum(self, **kwargs):
        return self.answers.pop(0)

    def should_commit(self, *args):
        return True


def test_quorums_are_recorded_when_they_change_with_leaves_joins_and_heals(tmp_path, monkeypatch):
    runtime = start_recording(tmp_path, monkeypatch, rank=1)
    try:
        both = ["g_0:a", "g_1:b"]
        client = torchft_hooks._QuorumClient(
            FakeClient([
                quorum(1, both), quorum(1, both), quorum(2, ["g_0:a"]),
                quorum(3, ["g_0:a", "g_1:c"], heal=True, recover_src_replica_rank=0, max_step=40),
            ]),
            runtime, group_size=1, group_rank=0,
        )  # fmt: skip
        for step in range(4):
            client._quorum(group_rank=0, step=step)
        assert client.should_commit(0, 1, True) is True  # the rest goes to torchft's client
        seen = [e for e in events(runtime, "torchft") if e["what"] == "quorum"]
        assert [e["quorum_id"] for e in seen] == [1, 2, 3]  # once per quorum, not per step
        assert seen[0]["replica_groups"] == [0, 1] and seen[0]["replica_ids"] == ["g_0", "g_1"]
        assert seen[1]["left"] == [1] and seen[2]["joined"] == [1]
        assert seen[2]["heal_from"] == 0 and seen[2]["heal_from_group"] == 0
        assert seen[2]["max_step"] == 40 and "heal_from" not in seen[1]
    finally:
        deactivate()


def fake_manager_module(replica_id: str, group_rank: int, group_size: int) -> types.ModuleType:
    module = types.ModuleType("fake_torchft_manager")

    class Manager:
        def __init__(self, pg, replica_id=None):
            self._group_rank, self._group_world_size = group_rank, group_size
            self._replica_id, self._pg = replica_id, pg
            self._client = FakeClient([quorum(1, ["job_0:x", "job_1:y", "job_2:z"])])

        def start_quorum(self):
            self._client._quorum(group_rank=self._group_rank, step=0)

        def _apply_pending_state_dict(self):
            self._pending_state_dict = None

        def current_step(self):
            return 7

    module.Manager = Manager
    return module


def test_building_a_manager_makes_the_process_torchft_s_global_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # the replica group's torchrun: 2 ranks
    monkeypatch.delenv("RANK", raising=False)
    module = fake_manager_module("job_1", group_rank=1, group_size=2)
    torchft_hooks.wrap_manager(module)
    try:
        manager = module.Manager(pg=types.SimpleNamespace(getBackendName=lambda: "torchft-gloo"),
                                 replica_id="job_1")  # fmt: skip
        runtime = core.active()
        assert runtime is not None and runtime.rank == 3  # replica group 1 x 2 + group rank 1
        manager.start_quorum()
        manager._apply_pending_state_dict()
        hellos = events(runtime, "hello")
        assert {h["world_size"] for h in hellos[:2]} == {4}  # its own group's end, first
        assert hellos[1]["torchft"]["replica_group"] == 1
        assert hellos[1]["backend"] == "torchft-gloo"
        assert hellos[-1]["world_size"] == 6  # a quorum showed replica group 2
        kinds = [(e["what"], e.get("step")) for e in events(runtime, "torchft")]
        assert kinds == [("quorum", 0), ("healed", 7)]
    finally:
        deactivate()


def test_torchft_s_process_group_collectives_are_recorded(tmp_path, monkeypatch):
    pytest.importorskip("torchft")
    import torch
    import torch.distributed as dist
    from torchft import process_group

    torchft_hooks.wrap_process_groups(process_group)
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = process_group.ProcessGroupGloo(timeout=datetime.timedelta(seconds=10))
    pg.configure(f"localhost:{store.port}/torchft/4/0", "job_0", 0, 1, 4, 0, 1, [0])
    runtime = start_recording(tmp_path, monkeypatch, rank=0)
    try:
        opts = dist.AllreduceOptions()
        pg.allreduce([torch.ones(3)], opts).wait()
        runtime.collectives.poll()
        (start,) = events(runtime, "collective_start")
        assert start["op"] == "all_reduce" and start["group"] == "torchft:q4:g0"
        assert start["group_ranks"] == [0] and start["shapes"] == [[3]]
        assert start["site"]["file"] == __file__  # the user's line
        assert len(events(runtime, "collective_end")) == 1
    finally:
        deactivate()
        pg.shutdown()
        del store
