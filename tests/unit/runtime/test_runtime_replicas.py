"""Replica digests in a rank (ddpdoctor/runtime/replicas.py, replica_calls.py): when they are taken,
what they hold, the calls they count; on a one-rank gloo world."""

from __future__ import annotations

import pytest

from ddpdoctor.runtime import replicas
from tests.runtime_helpers import events

torch = pytest.importorskip("torch")
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def make_model(bn: bool = False, **kwargs):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    return DDP(torch.nn.Sequential(*layers), **kwargs)


def train(model, opt, steps: int, after=None):
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        if after is not None:
            after(step)


def test_the_digest_is_an_exact_bit_sum_per_tensor_whatever_the_dtype():
    a = torch.tensor([1.0, -0.0, 2.5])
    b = torch.tensor([1.0, 0.0, 2.5])  # -0.0 and 0.0 differ in their bits
    half = torch.ones(3, dtype=torch.bfloat16)
    flags = torch.tensor([True, False])
    values = replicas.digest_tensors([a, b, half, flags, torch.arange(4).view(2, 2).t()])
    assert values[0] != values[1]
    assert values[0] == int(a.view(torch.int32).sum(dtype=torch.int64))  # 12 bytes: 4-byte words
    assert values[2] == 3 * int(half.view(torch.int16)[0]) and values[3] == 1
    assert values[4] == 6  # a transposed (non-contiguous) tensor of 8-byte integers
    pairs = torch.tensor([1.0, 2.0, 3.0, 4.0])  # 16 bytes: summed as two 8-byte words
    assert replicas.digest_tensors([pairs]) == [int(pairs.view(torch.int64).sum())]
    changed = pairs.clone()
    changed[3] = 4.5
    assert replicas.digest_tensors([changed]) != replicas.digest_tensors([pairs])
    assert replicas.digest_tensors([]) == []


def test_due_steps_are_powers_of_two_so_ranks_that_measured_differently_still_share_them():
    fast, slow = replicas.ModelState.__new__(replicas.ModelState), None
    for state in (fast,):
        state.costs, state.cost_s, state.step_s = [], None, None
        state.last_step = state.last_end = None
    replicas._schedule(fast, 0, 1e-4, 10.0)
    assert fast.next_step == 1  # step time not known yet
    replicas._schedule(fast, 1, 1e-4, 10.0 + 0.01 + 1e-4)  # 10 ms steps: 0.5 % is 50 µs
    assert fast.every == replicas.MIN_EVERY and fast.next_step == 8
    slow = replicas.ModelState.__new__(replicas.ModelState)
    slow.costs, slow.cost_s, slow.step_s, slow.last_step, slow.last_end = [], None, None, 0, 10.0
    replicas._schedule(slow, 1, 3e-3, 10.0 + 0.01 + 3e-3)  # 3 ms digests: every 60 -> 64
    assert slow.every == 64 and slow.next_step % fast.every == 0


def test_digests_come_at_the_due_steps_with_names_and_the_calls_that_wrote_the_model(
    recording, world, monkeypatch
):
    # every 8 steps whatever the digest costs here: on a loaded machine the measured cost
    # against a millisecond step would space them past the 20 steps this test trains
    monkeypatch.setattr(replicas, "MAX_EVERY", replicas.MIN_EVERY)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def after(step):
        sched.step()
        if step == 9:
            model.load_state_dict(saved)

    train(model, opt, 20, after)
    model(torch.randn(4, 8)).sum().backward()  # the forward of step 21 digests step 20
    recording.run_at_end()  # as destroy_process_group does: a final digest
    digests = events(recording, "replica_digest")
    steps = [d["step"] for d in digests if not d["final"]]
    assert steps[:2] == [0, 1] and all(s % 8 == 0 for s in steps[2:]) and len(steps) >= 3
    first = digests[0]
    assert first["names"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert first["buffers"] is False and len(first["digests"]) == 4
    assert "names" not in digests[1]  # said once, until they change
    final = digests[-1]
    assert final["final"] is True
    params = [p.detach() for p in model.module.parameters()]
    assert final["digests"] == replicas.digest_tensors(params)
    calls = {(c["what"], c["site"]["line"] if c["site"] else None): c for c in final["calls"]}
    load = next(c for (what, _), c in calls.items() if what.endswith("load_state_dict"))
    assert load["what"] == "DistributedDataParallel.load_state_dict"
    assert load["count"] == 1 and load["steps"] == [10] and load["ddp"] is True
    assert load["site"]["file"] == __file__
    stepped = [c for (what, _), c in calls.items() if what == "StepLR.step"]
    assert sorted(c["count"] for c in stepped) == [1, 20]  # the constructor's, the loop's
    # counted inline by the optimizer hook once its first steps are listed (optim_hooks.py)
    sgd = next(c for c in final["calls"] if c["what"] == "SGD.step")
    assert sgd["count"] == 20 and sgd["steps"] == list(range(1, 9))


def test_buffers_are_digested_right_after_ddp_broadcast_them_or_said_not_compared(recording, world):
    model = make_model(bn=True)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    digests = events(recording, "replica_digest")
    assert digests[0]["buffers"] is True and "1.running_mean" in digests[0]["names"]
    assert digests[0]["sync_buffers"] is True
    other = make_model(bn=True, broadcast_buffers=False)
    train(other, torch.optim.SGD(other.parameters(), lr=0.1), 2)
    mine = [d for d in events(recording, "replica_digest") if d["model"] == 1]
    assert mine and mine[0]["buffers"] is False and mine[0]["sync_buffers"] is False


def test_off_by_environment(tmp_path, monkeypatch, world):
    from ddpdoctor.runtime import deactivate
    from tests.runtime_helpers import start_recording

    monkeypatch.setenv(replicas.ENV, "0")
    runtime = start_recording(tmp_path, monkeypatch)
    try:
        model = make_model()
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
        assert events(runtime, "replica_digest") == []
    finally:
        deactivate()


def test_a_zero_optimizer_over_a_ddp_model_is_digested_once(recording, world, monkeypatch):
    """ZeroRedundancyOptimizer over a DDP model's parameters: the model's digest at its forward
    sums the same parameters at the same step; the optimizer adds no second digest."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    monkeypatch.setattr(replicas, "MAX_EVERY", replicas.MIN_EVERY)
    model = make_model()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    train(model, opt, 10)
    digests = [d for d in events(recording, "replica_digest") if not d["final"]]
    assert [d["step"] for d in digests] == [0, 1, 8] and len({d["model"] for d in digests}) == 1
    # the model's digests from the optimizer's first step on: its parameters are ZeRO's
    assert [d["replica"] for d in digests] == ["ddp", "zero", "zero"]


def test_a_zero_optimizer_digests_its_parameters_before_its_step(recording, world, monkeypatch):
    """ZeroRedundancyOptimizer over parameters no DDP digest covers (gradients averaged by
    hand): every parameter, digested in the optimizer's pre-step hook at the due steps, named
    after its module's parameters where one is known, else by position."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    monkeypatch.setattr(replicas, "MAX_EVERY", replicas.MIN_EVERY)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    for step in range(10):
        opt.zero_grad()
        module(torch.randn(2, 4)).sum().backward()
        opt.step()
        recording.steps.steps_done = step + 1
    mine = [d for d in events(recording, "replica_digest") if d["replica"] == "zero"]
    assert [d["step"] for d in mine] == [0, 1, 8]
    assert mine[0]["names"] == ["param[0] (8, 4)", "param[1] (8,)", "param[2] (1, 8)",
                                "param[3] (1,)"]  # fmt: skip
    assert "peers" not in mine[0]  # every rank holds them


def test_a_ddp_over_a_group_of_one_rank_is_not_digested(recording, world):
    """torchft's DDP runs over a dummy group of one rank (its Manager averages across replica
    groups that may be at other steps): no replica of another rank's to compare."""
    import torch.distributed as dist

    solo = dist.new_group([0])
    model = make_model(process_group=solo)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    assert events(recording, "replica_digest") == []


def test_no_digests_at_due_steps_once_a_join_is_entered_but_the_final_one_stays(
    recording, world, monkeypatch
):
    """Under torch's Join the ranks run different numbers of steps and their replicas differ
    between Join's syncs by design (runtime/join_hooks.py): a digest at a due step, compared with
    another rank's of the same number, would call a healthy job diverged."""
    from torch.distributed.algorithms import Join

    monkeypatch.setattr(replicas, "MAX_EVERY", replicas.MIN_EVERY)
    model = make_model()
    opt = torch.optim.Adam(model.parameters())
    train(model, opt, 9)  # digests at 0, 1 and 8, before any Join
    for _epoch in range(2):
        with Join([model]):
            train(model, opt, 12)
    with Join([model], enable=False):  # a disabled Join evens nothing: still no digests
        train(model, opt, 8)
    recording.run_at_end()
    digests = events(recording, "replica_digest")
    assert [d["step"] for d in digests if not d["final"]] == [0, 1, 8]
    assert [d["final"] for d in digests][-1] is True  # Join has synced the model by the end
