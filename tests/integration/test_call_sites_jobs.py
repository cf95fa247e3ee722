"""Call sites and GPU code on real jobs: a Lightning job whose `strategy.barrier()` runs on rank 0
only (gloo pairs it with Lightning's next barrier) is a mismatch of rank 0 at the user's line;
GPU code as published, launched on a machine without a GPU, is a crash headed by the ranks'
exception at their line, never "not started"."""

from __future__ import annotations

import pytest

from tests.integration.conftest import FRAMEWORK_FAULTS

pytestmark = pytest.mark.integration


def test_a_rank_zero_only_lightning_barrier_is_rank_0s_at_its_line(shared_runs):
    result = shared_runs.get("lightning-barrier-rank0")
    diagnosis = result.diagnosis
    assert diagnosis["verdict"] == "mismatch", result.explain()
    assert diagnosis["culprits"] == [0], result.explain()
    finding = result.finding("mismatch")
    line = next(
        n
        for n, text in enumerate(
            (FRAMEWORK_FAULTS / "lit_barrier_rank0.py").read_text().split("\n"), 1
        )
        if "strategy.barrier()  # <-" in text
    )
    assert (
        "rank 0 called barrier #" in finding["summary"]
        and f"from lit_barrier_rank0.py:{line} Model.on_train_epoch_end via DDPStrategy.barrier;"
        " rank 1 never did"
        in finding["summary"]
    ), finding["summary"]
    evidence = finding["evidence"][0]
    assert evidence["file"].endswith("lit_barrier_rank0.py") and evidence["line"] == line


def test_gpu_code_on_a_machine_without_a_gpu_crashes_at_its_line(shared_runs):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the published GPU code runs")
    result = shared_runs.get("gpu-code-without-gpu")
    diagnosis = result.diagnosis
    assert diagnosis["verdict"] == "crash", result.explain()
    first = diagnosis["findings"][0]
    assert first["id"] == "crash.before_init"
    assert "Found no NVIDIA driver" in first["summary"]
    assert "gpu_published.py:17 in main, before joining a process group" in first["summary"]
    assert result.returncode == 1
