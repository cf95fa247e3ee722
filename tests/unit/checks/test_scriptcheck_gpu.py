"""GPU code on a machine without a GPU: the doctor's script checkup reports hard-coded NCCL and
CUDA as errors with the line and the fix, from recorded GPU facts; on a GPU machine, and for
scripts that pick their device themselves, nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.gpu_plan import no_gpu_reason
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.runner import run_checks
from ddpdoctor.checks.scriptcheck import check_scripts
from tests.unit.recorded_machines import context

RULE = "script.gpu_code_without_gpu"
TUTORIAL = Path(__file__).resolve().parents[3] / "tests" / "corpus" / "ddp_tutorial_series"


def script_results(machine: str, path: str, env: dict[str, str] | None = None):
    """The doctor's results for the script on a recorded machine (the runner's own path)."""
    ctx = context(machine, env, options=DoctorOptions(smoke=False, scripts=(path,)))
    return [r for r in run_checks(["gpu"], context=ctx).results if r.group == "script"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_published_tutorial_fails_before_launch_on_a_cpu_machine():
    path = str(TUTORIAL / "multigpu_torchrun.py")
    results = [r for r in script_results("cpu-only", path) if r.id == RULE]
    assert [r.status for r in results] == [Status.FAIL] * len(results) and results
    lines = {r.facts["line"]: r.summary for r in results}
    text = (TUTORIAL / "multigpu_torchrun.py").read_text().splitlines()
    nccl = next(n for n, line in enumerate(text, 1) if '"nccl"' in line)
    assert 'init_process_group(backend="nccl") needs a GPU' in lines[nccl]
    assert any("torch.cuda.set_device()" in s for s in lines.values())
    first = results[0]
    assert "this machine: no NVIDIA driver (libcuda.so.1" in first.details[1]
    assert first.fix


@pytest.mark.parametrize("machine", ["a100-8x", "workstation-2gpu-busy"])
def test_on_a_gpu_machine_gpu_code_is_fine(machine):
    path = str(TUTORIAL / "multigpu_torchrun.py")
    assert not [r for r in script_results(machine, path) if r.id == RULE]


def test_cuda_visible_devices_hiding_every_gpu_counts_as_no_gpu():
    ctx = context("a100-8x", {"CUDA_VISIBLE_DEVICES": "-1"})
    assert no_gpu_reason(ctx) is not None
    assert no_gpu_reason(context("a100-8x")) is None
    assert no_gpu_reason(context("cpu-only")).startswith("no NVIDIA driver")


def test_each_kind_is_reported_once_at_its_first_line(tmp_path):
    path = write(
        tmp_path,
        """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        backend = "nccl"
        dist.init_process_group(backend=backend)
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        model = torch.nn.Linear(2, 2).to(f"cuda:{rank}")
        model2 = torch.nn.Linear(2, 2).cuda()
        ddp = DDP(model, device_ids=[rank])
        """,
    )
    found = [(f.line, f.summary) for f in check_scripts([path], no_gpu=True) if f.rule == RULE]
    assert [line for line, _ in found] == [8, 10, 13]
    assert check_scripts([path]) == [f for f in check_scripts([path]) if f.rule != RULE]


def test_a_script_that_picks_its_device_is_left_alone(tmp_path):
    path = write(
        tmp_path,
        """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        use_cuda = torch.cuda.is_available()
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        rank = int(os.environ["LOCAL_RANK"])
        if torch.cuda.is_available():
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        model = torch.nn.Linear(2, 2).to(device)
        ddp = DDP(model, device_ids=[rank] if use_cuda else None)
        """,
    )
    assert [f for f in check_scripts([path], no_gpu=True) if f.rule == RULE] == []


def test_lightning_gpu_accelerator(tmp_path):
    path = write(
        tmp_path,
        """
        import lightning as L

        trainer = L.Trainer(accelerator="gpu", devices=2, strategy="ddp")
        """,
    )
    found = [f for f in check_scripts([path], no_gpu=True) if f.rule == RULE]
    assert [(f.line, f.summary.split(" needs")[0]) for f in found] == [
        (4, 'Trainer(accelerator="gpu")')
    ]
