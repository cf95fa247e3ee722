"""phase / log / warn / fault: no-ops when inactive, events when active, never raising."""

from __future__ import annotations

import pytest

import ddpdoctor
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import activate, active, api, deactivate
from tests.runtime_helpers import events, start_recording


@pytest.fixture
def recording(tmp_path, monkeypatch):
    yield start_recording(tmp_path, monkeypatch, rank=1)  # no process group needed
    deactivate()


def test_everything_is_a_no_op_without_a_run_directory(monkeypatch):
    monkeypatch.delenv("DDPDOCTOR_RUN_DIR", raising=False)
    assert activate() is None
    assert active() is None
    with api.phase("eval") as scope:
        assert scope is not None
    api.log(loss=0.5, step=3)
    api.warn("x.y", "message", a=1)
    api.fault("hang:rank=0,step=5", "hang", 5)


def test_activate_reads_the_environment_and_is_idempotent(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPDOCTOR_RUN_DIR", str(tmp_path / "envrun"))
    monkeypatch.setenv("RANK", "3")
    try:
        first = activate()
        assert first is not None and activate() is first and activate(tmp_path / "x") is first
        assert first.rank == 3
        assert first.run_dir.events_file(3).exists()
        (hello,) = [
            parse_event_line(line)
            for line in first.run_dir.events_file(3).read_bytes().split(b"\n")
            if b'"hello"' in line
        ]
        assert hello["pid"] > 0 and hello["versions"]["ddpdoctor"] == ddpdoctor.__version__
        assert hello["heartbeat_s"] == 1.0
    finally:
        deactivate()


def test_phase_as_a_context_manager_restores_the_previous_one(recording):
    ddpdoctor.phase("train")
    with ddpdoctor.phase("checkpoint"):
        assert recording.phase == "checkpoint"
    assert recording.phase == "train"
    ddpdoctor.phase("train")  # no change, no event
    phases = [(e["phase"], e["previous"]) for e in events(recording, "phase")]
    assert phases == [("train", "init"), ("checkpoint", "train"), ("train", "checkpoint")]


def test_log_attaches_the_loss_to_the_current_step(recording):
    recording.steps.on_forward(1.0, grad=True, synced=True, batch_size=2)
    ddpdoctor.log(loss=0.25, lr=0.1, kind="odd name", note=object())
    recording.steps.flush()
    (metrics,) = events(recording, "metrics")
    assert metrics["loss"] == 0.25 and metrics["lr"] == 0.1 and metrics["step"] == 1
    assert metrics["kind"] == "metrics" and metrics["user_kind"] == "odd name"
    assert metrics["note"].startswith("<object")
    (step,) = events(recording, "step")
    assert step["loss"] == 0.25


def test_log_converts_tensors_and_keeps_non_finite_readable(recording):
    torch = pytest.importorskip("torch")
    ddpdoctor.log(step=7, loss=torch.tensor(1.5), grad_norm=float("nan"), sizes=[1, 2])
    (metrics,) = events(recording, "metrics")
    assert metrics["loss"] == 1.5 and metrics["step"] == 7
    assert metrics["grad_norm"] == "nan"
    assert metrics["sizes"] == [1, 2]


def test_warn_and_fault_events(recording):
    api.warn("data.short_shard", "rank 1 has fewer samples", samples=900)
    api.fault("crash:rank=1,step=5", "crash", 5)
    (warning,) = events(recording, "warning")
    assert warning["code"] == "data.short_shard"
    assert warning["details"] == {"samples": 900}
    (fault,) = events(recording, "fault")
    assert (fault["inject"], fault["fault"], fault["step"]) == ("crash:rank=1,step=5", "crash", 5)


def test_never_raises_even_with_hostile_values(recording):
    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

        def item(self):
            raise RuntimeError("no")

    ddpdoctor.log(x=Hostile())
    api.warn(Hostile(), "m")
    api.fault("s", "k", "not a number")
    with api.phase(Hostile()):
        pass
