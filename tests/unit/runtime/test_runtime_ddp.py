"""DDP steps and gradient buckets on a real single-process gloo group."""

from __future__ import annotations

import sys
import time

import pytest

from ddpdoctor.runtime import activate, api, deactivate
from ddpdoctor.runtime.ddp_hooks import SLOT_ATTR
from tests.runtime_helpers import events, wait_until

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


@pytest.fixture(autouse=True)
def bucket_hook(monkeypatch):
    """Most tests here are about the Python comm hook (--ddp-buckets); the default (no hook, the
    flight recorder read on demand) has its own tests below."""
    monkeypatch.setenv("DDPDOCTOR_DDP_BUCKETS", "1")


def make_model(**kwargs):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return DDP(net, **kwargs)


def train_step(model, batch=4):
    loss = model(torch.randn(batch, 8)).pow(2).mean()
    loss.backward()
    return loss


def test_training_forwards_are_steps_with_buckets_and_timings(recording):
    model = make_model()
    for _ in range(3):
        loss = train_step(model)
        api.log(loss=loss)  # a tensor: becomes a float attached to the step
    api.phase("eval")  # a phase change closes the last step
    steps = events(recording, "step")
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["batch_size"] == 4 and s["forwards"] == 1
        assert isinstance(s["loss"], float)
        parts = s["data_time_s"] + s["compute_time_s"] + s["comm_wait_s"]
        assert parts == pytest.approx(s["step_time_s"], abs=1e-5)
        assert s["samples_per_s"] == pytest.approx(4 / s["step_time_s"], rel=1e-2)
    buckets = [e for e in events(recording, "collective_start") if "bucket" in e]
    assert len(buckets) >= 3
    assert all(b["op"] == "all_reduce" and b["group"] == "default" for b in buckets)
    assert [b["seq"] for b in buckets] == list(range(1, len(buckets) + 1))
    assert sum(buckets[0]["shapes"][0][0] for _ in [0]) > 0
    wait_until(lambda: len(events(recording, "collective_end")) == len(buckets))
    assert all(e["ok"] for e in events(recording, "collective_end"))
    metrics = events(recording, "metrics")
    assert [m["step"] for m in metrics] == [1, 2, 3]


def test_one_wrapper_stands_between_a_ddp_forward_and_torchs(recording):
    """Everything ddpdoctor does at a DDP forward runs in one Python frame: the wrapper's
    original is torch's own forward, and the only ddpdoctor frame under it is the wrapper."""
    from ddpdoctor.runtime.patching import WRAPPED_MARK

    inner = getattr(DDP.forward, WRAPPED_MARK)
    assert not hasattr(inner, WRAPPED_MARK) and inner.__module__.startswith("torch.")
    model = make_model()
    seen: list[list[str]] = []

    def pre_hook(_module, _args):  # runs inside torch's forward of the wrapped module
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            if "ddpdoctor" in frame.f_code.co_filename:
                frames.append(frame.f_code.co_name)
            frame = frame.f_back
        seen.append(frames)

    model.module.register_forward_pre_hook(pre_hook)
    train_step(model)
    assert seen == [["forward"]]


def test_no_sync_forwards_accumulate_into_the_next_synced_step(recording):
    model = make_model()
    with model.no_sync():
        train_step(model, batch=2)
        train_step(model, batch=3)
    train_step(model, batch=5)
    train_step(model, batch=4)
    recording.steps.flush()
    steps = events(recording, "step")
    assert [(s["forwards"], s["batch_size"]) for s in steps] == [(3, 10), (1, 4)]
    # no bucket all-reduce ran for the no_sync micro-batches
    assert len([e for e in events(recording, "collective_start") if "bucket" in e]) == 2


def test_eval_forwards_are_not_steps(recording):
    model = make_model()
    train_step(model)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8))
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 8))
    recording.steps.flush()
    assert [s["step"] for s in events(recording, "step")] == [1]


def test_user_comm_hook_registered_before_the_first_forward_still_runs(recording):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    model = make_model()
    model.register_comm_hook(None, counting_hook)
    train_step(model)
    train_step(model)
    assert len(calls) >= 2
    assert len([e for e in events(recording, "collective_start") if "bucket" in e]) == len(calls)
    assert (
        model._get_ddp_logging_data().get("comm_hook")
        == "test_user_comm_hook_registered_before_the_first_forward_still_runs.<locals>.counting_hook"
    )


def test_user_comm_hook_registered_after_training_started_replaces_the_delegate(recording):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def counting_hook(state, bucket):
        calls.append(state)
        return allreduce_hook(None, bucket)

    model = make_model()
    train_step(model)  # ddpdoctor's hook is registered by now
    model.register_comm_hook("my-state", counting_hook)
    train_step(model)
    assert calls and set(calls) == {"my-state"}
    with pytest.raises(RuntimeError, match="can only be called once"):
        model.register_comm_hook(None, counting_hook)  # as DDP itself refuses a second one


def test_a_wrong_user_hook_is_refused_as_ddp_refuses_it(recording):
    model = make_model()

    def bad_hook(state, bucket: int):
        return None

    with pytest.raises(ValueError, match="bucket annotation"):
        model.register_comm_hook(None, bad_hook)


def test_builtin_cpp_hook_is_left_alone_with_a_warning(recording):
    model = make_model()
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(model)
    assert all(p.grad is not None for p in model.parameters())
    assert before  # trained without error
    (warning,) = events(recording, "warning")
    assert warning["code"] == "ddp.builtin_comm_hook"
    assert [e for e in events(recording, "collective_start") if "bucket" in e] == []


def test_builtin_hook_after_training_started_runs_as_its_python_twin(recording):
    model = make_model()
    train_step(model)
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    train_step(model)
    assert len([e for e in events(recording, "collective_start") if "bucket" in e]) >= 2


class SlowDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(8)


def test_data_wait_is_split_from_compute(recording):
    model = make_model()
    loader = DataLoader(SlowDataset(), batch_size=2)
    for batch in loader:
        model(batch).sum().backward()
    steps = events(recording, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]  # the last closed by the loader's end
    for s in steps[1:]:  # each fetch of 2 items sleeps >= 20 ms
        assert s["data_time_s"] >= 0.018
        assert s["data_time_s"] <= s["step_time_s"]
    assert {s["epoch"] for s in steps} == {0}


def test_bucket_recording_can_be_switched_off(tmp_path, monkeypatch, world):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("DDPDOCTOR_DDP_BUCKETS", "0")
    runtime = activate(tmp_path / "run")
    try:
        model = make_model()
        train_step(model)
        train_step(model)
        runtime.steps.flush()
        assert [s["step"] for s in events(runtime, "step")] == [1, 2]
        assert events(runtime, "collective_start") == []
        assert not hasattr(model, SLOT_ATTR)
    finally:
        deactivate()


def test_a_bucket_is_described_once_and_its_events_say_the_same(recording):
    model = make_model()
    for _ in range(4):
        train_step(model)
    slot = getattr(model, SLOT_ATTR)
    descriptions = dict(slot.buckets)
    train_step(model)
    assert slot.buckets == descriptions  # nothing new: every bucket was known
    buckets = [e for e in events(recording, "collective_start") if "bucket" in e]
    numel = sum(p.numel() for p in model.parameters())
    assert sum(b["numel"] for b in buckets[-len(descriptions) :]) == numel
    assert {(b["bucket"], tuple(b["shapes"][0]), b["dtypes"][0]) for b in buckets} == {
        (index, (n,), "float32") for index, n, _dtype in descriptions
    }


def phases(runtime):
    return [(e["phase"], e["previous"]) for e in events(runtime, "phase")]


def test_phase_follows_the_forwards_until_the_script_names_one(recording):
    model = make_model()
    assert recording.phase == "init"
    train_step(model)
    train_step(model)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8))
        model(torch.randn(4, 8))
    assert recording.phase == "eval"
    model.train()
    with torch.no_grad():  # a forward without gradients is no training step either
        model(torch.randn(4, 8))
    train_step(model)
    assert phases(recording) == [("train", "init"), ("eval", "train"), ("train", "eval")]
    beat = recording.heartbeat.fields()
    assert beat["phase"] == "train"
    api.phase("validate")  # the script's own phase wins from here on
    train_step(model)
    model.eval()
    model(torch.randn(4, 8))
    assert recording.phase == "validate"
    assert phases(recording)[-1] == ("validate", "train")
    assert [s["step"] for s in events(recording, "step")] == [1, 2, 3, 4]


def test_a_phase_set_before_training_is_kept(recording):
    api.phase("warmup")
    train_step(make_model())
    assert recording.phase == "warmup"
    assert phases(recording) == [("warmup", "init")]


def test_recorded_buckets_reduce_as_plain_ddp(recording):
    """Several buckets (a tiny bucket cap): the gradients equal plain DDP's, and every bucket of
    every backward pass, launched in index order, ends through its future."""

    def big_model():
        torch.manual_seed(0)
        layers = [torch.nn.Linear(64, 64) for _ in range(4)]
        return torch.nn.Sequential(*layers)

    inputs = [torch.randn(8, 64) for _ in range(3)]
    deactivate()  # plain DDP first, on the same inputs
    plain = DDP(big_model(), bucket_cap_mb=0.01)
    for x in inputs:
        plain(x).sum().backward()
    runtime = activate(recording.run_dir.path)
    assert runtime is not None
    try:
        model = DDP(big_model(), bucket_cap_mb=0.01)
        for x in inputs:
            model(x).sum().backward()
        for ours, theirs in zip(model.parameters(), plain.parameters(), strict=True):
            assert torch.equal(ours.grad, theirs.grad)
        starts = [e for e in events(runtime, "collective_start") if "bucket" in e]
        buckets = {e["bucket"] for e in starts}
        assert len(buckets) >= 3
        wait_until(lambda: len(events(runtime, "collective_end")) == len(starts))
        ends = {e["seq"]: e for e in events(runtime, "collective_end")}
        assert all(e["ok"] for e in ends.values())
        passes: list[list[dict]] = []  # DDP launches a pass's buckets in index order from 0
        for start in starts:
            if start["bucket"] == 0:
                passes.append([])
            passes[-1].append(start)
        assert len(passes) == len(inputs)
        for one in passes:
            assert [start["bucket"] for start in one] == list(range(len(one)))
            assert [ends[start["seq"]]["via"] for start in one] == ["future"] * len(one)
    finally:
        deactivate()


def test_by_default_ddp_keeps_its_cpp_all_reduce_and_hello_says_why(tmp_path, monkeypatch, world):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("DDPDOCTOR_DDP_BUCKETS")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    runtime = activate(tmp_path / "run")
    try:
        model = make_model()
        train_step(model)
        train_step(model)
        runtime.steps.flush()
        assert [s["step"] for s in events(runtime, "step")] == [1, 2]
        assert [e for e in events(runtime, "collective_start") if "bucket" in e] == []
        assert getattr(model, SLOT_ATTR, None) is None  # no comm hook registered
        hello = events(runtime, "hello")[-1]
        assert hello["buckets"]["mode"] == "flight_recorder"
        assert "flight recorder" in hello["buckets"]["why"]
    finally:
        deactivate()


def test_the_buckets_show_in_the_flight_recorder_answer(tmp_path, monkeypatch, world):
    """The monitor's request, answered by the heartbeat thread with the backend's record of the
    gradient all-reduces that no event described."""
    from ddpdoctor.protocol.flight_recorder import parse_dump
    from ddpdoctor.protocol.fr_requests import read_answers, write_request

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("DDPDOCTOR_HEARTBEAT_S", "0.05")
    monkeypatch.delenv("DDPDOCTOR_DDP_BUCKETS")
    runtime = activate(tmp_path / "run")
    try:
        model = make_model()
        train_step(model)
        request = write_request(runtime.run_dir)
        wait_until(lambda: 0 in read_answers(runtime.run_dir))
        answer = read_answers(runtime.run_dir)[0]
        assert answer.request_id == request.id and answer.error is None
        dump = parse_dump(answer.dump, rank=0, taken_t=answer.taken_t)
        last = dump.entries[-1]
        numel = sum(p.numel() for p in model.parameters())
        assert (last.op, last.backend, last.input_sizes) == ("all_reduce", "gloo", ((numel,),))
        assert dump.pending("0") is None  # a one-rank all-reduce completes at once
    finally:
        deactivate()


def test_bucket_mode_follows_the_variable():
    from ddpdoctor.runtime.ddp_hooks import bucket_mode

    hook, why = bucket_mode({"DDPDOCTOR_DDP_BUCKETS": "1"})
    assert hook and why["mode"] == "python_hook" and "--ddp-buckets" in why["why"]
    hook, why = bucket_mode({"DDPDOCTOR_DDP_BUCKETS": "0"})
    assert not hook and why["mode"] == "off"
    hook, why = bucket_mode({})
    assert not hook and why["mode"] == "flight_recorder"


@pytest.fixture
def timers_runtime(tmp_path, monkeypatch, world):
    """Rank 0's runtime without the bucket hook: the all-reduce wait comes from DDP's timers."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("DDPDOCTOR_DDP_BUCKETS")
    runtime = activate(tmp_path / "run")
    yield runtime
    deactivate()


def test_without_the_hook_ddps_own_timers_give_the_all_reduce_wait(timers_runtime):
    from ddpdoctor.runtime.ddp_hooks import PROBE_ATTR, CommProbe

    runtime = timers_runtime
    model = make_model()
    for _ in range(4):
        train_step(model)
    probe = getattr(model, PROBE_ATTR)
    assert isinstance(probe, CommProbe) and probe.adapt  # a CPU model
    runtime.steps.ddp_comm_s = -1.0
    probe.next_t = 0.0  # due: the next synced forward reads DDP's stats
    train_step(model)
    assert probe.iteration >= 3 and 0.0 <= runtime.steps.ddp_comm_s < 1.0
    assert probe.next_t > 0.0
    probe.next_t = 0.0  # tiny steps: DDP samples one iteration in many, not all
    train_step(model)
    assert 1 < probe.rate <= 100
    runtime.steps.ddp_comm_s = 0.25  # what DDP's timers said lately stands for each step
    train_step(model)
    runtime.steps.flush()
    last = events(runtime, "step")[-1]
    assert last["comm_wait_s"] == pytest.approx(min(0.25, last["step_time_s"]), abs=2e-6)


def test_the_steps_before_ddps_timers_are_first_read_have_no_split(timers_runtime):
    """Until the first read, the all-reduce wait is unknown: counted as compute, a straggler's
    peers looked as slow as the straggler (their wait inside DDP's all-reduce became their work)."""
    from ddpdoctor.runtime.ddp_hooks import PROBE_ATTR

    runtime = timers_runtime
    model = make_model()
    train_step(model)
    probe = getattr(model, PROBE_ATTR)
    probe.next_t = float("inf")  # not due, however slow the machine (the first read is 0.25 s on)
    for _ in range(2):
        train_step(model)
    assert runtime.steps.ddp_comm_s is None
    probe.next_t = 0.0
    train_step(model)  # its forward closes step 3 (still unsplit), then reads the timers
    assert runtime.steps.ddp_comm_s is not None
    train_step(model)
    runtime.steps.flush()
    steps = events(runtime, "step")
    assert [s["comm_wait_s"] for s in steps[:3]] == [None, None, None]
    assert [s["compute_time_s"] for s in steps[:3]] == [None, None, None]
    assert all(s["data_time_s"] is not None for s in steps)
    assert all(isinstance(s["comm_wait_s"], float) for s in steps[4:])
    assert isinstance(steps[-1]["compute_time_s"], float)


def test_gradient_syncs_are_counted_and_written_as_the_latest_number(tmp_path, monkeypatch, world):
    """By default every synced forward adds one to a count that the heartbeat writes when it
    flushes: the highest number with the line of the forward after the previous write, never a
    frame walk or an event per forward."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("DDPDOCTOR_DDP_BUCKETS")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    runtime = activate(tmp_path / "run")
    try:
        model = make_model()
        for _ in range(3):
            train_step(model)  # the line every sync comes from
        with model.no_sync():
            train_step(model)  # not a sync
        wait_until(lambda: any(e["seq"] == 3 for e in events(runtime, "collective_end")))
        syncs = [e for e in events(runtime, "collective_start") if e["op"] == "ddp_gradient_sync"]
        assert syncs and syncs[-1]["seq"] == 3 and syncs[-1]["group"].endswith(":ddp_grads")
        assert syncs[0]["site"]["file"].endswith("test_runtime_ddp.py")
        assert len(syncs) <= 3  # batched: as many records as flushes, at most one per sync
        train_step(model)  # after no_sync: its line is the deciding one
        runtime.collectives.poll()
        last = [e for e in events(runtime, "collective_start") if e["op"] == "ddp_gradient_sync"]
        assert last[-1]["seq"] == 4
    finally:
        deactivate()
