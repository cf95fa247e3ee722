"""scripts/gpu_check.py (`make gpu-check`): on a machine without a GPU it says so in one line and
exits 0 at once; its report reads a summary's parts; its part on the hang judges the verdict, the
culprit and the line together. No job is started here (the rehearsal on CPU is `--rehearse`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.procs import REPO, load_script

gpu_check = load_script("scripts/gpu_check.py")


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gpu_check, "gpu_names", lambda: [])
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out")])
    assert gpu_check.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "gpu-check: no NVIDIA GPU on this machine (NVML and nvidia-smi find none); nothing to check"
    ]
    assert not (tmp_path / "out").exists()


def test_make_gpu_check_runs_the_script():
    shown = subprocess.run(
        ["make", "-n", "gpu-check"], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0
    assert "scripts/gpu_check.py" in shown.stdout


@pytest.mark.skipif(bool(gpu_check.gpu_names()), reason="a GPU is here: make gpu-check runs it")
def test_on_this_machine_without_a_gpu_the_script_ends_at_once():
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("gpu-check: no NVIDIA GPU")


def hang_part(monkeypatch, diagnosis_like: dict) -> dict:
    monkeypatch.setattr(gpu_check, "reference_run", lambda *a, **k: dict(diagnosis_like))
    return gpu_check.part_hang(60.0, REPO, 2)


@pytest.mark.parametrize(
    ("exit_code", "verdict", "culprits", "lines", "ok"),
    [
        (1, "hang", [1], ["train.py:40"], True),
        (1, "hang", [0], ["train.py:40"], False),  # the wrong rank
        (1, "hang", [1], [], False),  # no line named
        (0, "healthy", [], [], False),  # the hang missed
    ],
)
def test_the_hang_part_needs_verdict_culprit_and_line(
    monkeypatch, exit_code, verdict, culprits, lines, ok
):
    got = hang_part(
        monkeypatch,
        {"exit_code": exit_code, "verdict": verdict, "culprits": culprits, "lines": lines},
    )
    assert got["ok"] is ok
    assert got["injected"] == "hang:rank=1,step=20"


def test_the_text_report_names_every_part():
    wall = {
        "plain_ms_per_step": 10.0,
        "instrumented_ms_per_step": 10.1,
        "time_ratio": 1.01,
        "pair_overhead_pct": [0.5, 1.5],
    }
    summary = {
        "gpus": 1,
        "gpu_names": ["NVIDIA H200"],
        "seconds": 200.0,
        "ok": False,
        "out": "build/gpu-check",
        "parts": {
            "gpu_tests": {"ok": True, "summary": "7 passed"},
            "doctor": {"ok": True, "counts": {"fail": 0}, "gpu_nccl_nvml": []},
            "healthy": {"ok": True, "verdict": "healthy", "exit_code": 0, "culprits": []},
            "hang": {"ok": False, "verdict": "running", "exit_code": 124, "culprits": []},
            "overhead": {"ok": True, "wall": wall},
        },
    }
    text = gpu_check.text_report(summary)
    assert "1 GPU(s): NVIDIA H200" in text
    assert "7 passed" in text
    assert "hang            FAIL verdict running exit 124" in text
    assert "ratio 1.010 (pairs +0.5% .. +1.5%)" in text
    assert text.endswith("some part FAILED; details in build/gpu-check")


def test_on_one_gpu_the_hang_part_is_skipped_with_its_reason(monkeypatch):
    # NCCL runs one rank per GPU: a world of one has no peer that waits for the culprit, so no
    # job is started (reference_run would fail the test) and the report says why
    monkeypatch.setattr(gpu_check, "reference_run", lambda *a, **k: pytest.fail("a job started"))
    got = gpu_check.part_hang(60.0, REPO, 1)
    assert got["ok"] is True and "one GPU" in got["skipped"]
    summary = {
        "gpus": 1, "gpu_names": ["NVIDIA H200"], "seconds": 1.0, "ok": True, "out": "o",
        "parts": {"hang": got},
    }  # fmt: skip
    assert "hang            --  skipped: one GPU" in gpu_check.text_report(summary)
