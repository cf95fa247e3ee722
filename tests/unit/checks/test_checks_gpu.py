"""gpu.* checks on recorded machines (tests/fixtures/facts) with injected environments."""

from __future__ import annotations

import dataclasses

import pytest

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.cuda_visible import parse_visible_devices
from ddpdoctor.checks.gpu import gpu_count, gpu_cuda, gpu_devices, gpu_visible_devices
from ddpdoctor.checks.model import CheckResult, Status
from tests.unit.recorded_machines import MACHINES, context, load_machine


def run(check, ctx) -> CheckResult:
    result = check(ctx)
    assert result.status is not Status.ERROR, (result.summary, result.details)
    if result.status in (Status.WARN, Status.FAIL):
        assert result.fix, "every warning and failure carries a fix"
    return result


def options(**kw) -> DoctorOptions:
    return DoctorOptions(smoke=False, **kw)


def test_recorded_machines_are_all_there():
    assert set(MACHINES) >= {
        "a100-8x",
        "workstation-2gpu-busy",
        "a100-mig",
        "exclusive-process",
        "cpu-only",
        "old-driver",
    }


# --- gpu.cuda --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "status", "words"),
    [
        ("a100-8x", Status.PASS, ["torch 2.3.1+cu121", "driver 535.104.05 (CUDA 12.2)", "sees 8"]),
        ("a100-mig", Status.PASS, ["CUDA 12.1 build", "CUDA 12.0"]),  # minor-version compat
        ("exclusive-process", Status.PASS, ["CUDA 11.7 build", "CUDA 11.4"]),
        ("cpu-only", Status.PASS, ["no NVIDIA GPU", "CPU-only build", "gloo on the CPU"]),
        ("old-driver", Status.FAIL, ["driver 470.82.01 supports CUDA up to 11.4", "CUDA 12.1"]),
    ],
)
def test_cuda_on_recorded_machines(machine, status, words):
    result = run(gpu_cuda, context(machine))
    assert result.status is status, result.summary
    for word in words:
        assert word in result.summary


def test_old_driver_fix_names_a_driver_and_a_build_that_fits():
    result = run(gpu_cuda, context("old-driver"))
    assert "525.60.13" in result.fix  # the oldest driver for CUDA 12
    assert "whl/cu118" in result.fix  # a CUDA 11 build runs on a CUDA 11.4 driver
    assert "torch.cuda.is_available() is False" in " ".join(result.details)


def test_no_gpu_never_imports_torch():
    ctx = context("cpu-only")
    run(gpu_cuda, ctx)
    run(gpu_count, ctx)
    assert ctx.probes.torch.runtime_calls == []


def test_cpu_torch_on_a_gpu_machine_warns():
    cpu_torch = load_machine("cpu-only").torch
    result = run(gpu_cuda, context("a100-8x", torch=cpu_torch))
    assert result.status is Status.WARN
    assert "torch 2.3.0+cpu (CPU-only build) cannot use the 8 GPU(s)" in result.summary
    assert "whl/cu129" in result.fix  # newest CUDA 12 build for a CUDA 12.2 driver


def test_libcuda_stub_fails():
    gpu = dataclasses.replace(
        load_machine("a100-8x").gpu,
        libcuda_path="/usr/local/cuda-12.2/targets/x86_64-linux/lib/stubs/libcuda.so",
    )
    result = run(gpu_cuda, context("a100-8x", gpu=gpu))
    assert result.status is Status.FAIL
    assert "stub" in result.summary and "F26" in result.summary
    assert "/usr/local/cuda-12.2/targets/x86_64-linux/lib/stubs" in result.fix


def test_stub_directory_on_the_path_warns():
    gpu = dataclasses.replace(
        load_machine("a100-8x").gpu, stub_dirs_on_path=("/usr/local/cuda/lib64/stubs",)
    )
    result = run(gpu_cuda, context("a100-8x", gpu=gpu))
    assert result.status is Status.WARN and "/usr/local/cuda/lib64/stubs" in result.summary


def test_torch_not_seeing_cuda_fails():
    runtime = dataclasses.replace(load_machine("a100-8x").runtime, cuda_available=False)
    result = run(gpu_cuda, context("a100-8x", runtime=runtime))
    assert result.status is Status.FAIL
    assert "torch.cuda.is_available() is False" in result.summary


def test_torch_missing_fails():
    torch = dataclasses.replace(load_machine("cpu-only").torch, installed=False, error="gone")
    result = run(gpu_cuda, context("cpu-only", torch=torch))
    assert result.status is Status.FAIL and "pip install torch" in result.fix


def test_hidden_gpus_do_not_start_torch():
    ctx = context("a100-8x", {"CUDA_VISIBLE_DEVICES": ""})
    result = run(gpu_cuda, ctx)
    assert result.status is Status.PASS
    assert ctx.probes.torch.runtime_calls == []


# --- gpu.visible_devices -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "value", "status", "words"),
    [
        ("a100-8x", None, Status.PASS, ["all 8 GPU(s) visible"]),
        ("cpu-only", None, Status.PASS, ["no GPU here"]),
        ("a100-8x", "0,1", Status.PASS, ["GPU 0, GPU 1 visible"]),
        ("a100-8x", ",,7", Status.FAIL, ["empty entry at position 1"]),
        ("workstation-2gpu-busy", ",,7", Status.FAIL, ["empty entry at position 1"]),
        ("cpu-only", ",,7", Status.FAIL, ["empty entry at position 1"]),
        ("a100-8x", "", Status.FAIL, ["hides every GPU"]),
        ("a100-8x", "0,0", Status.FAIL, ["listed twice"]),
        ("workstation-2gpu-busy", "0,1,2", Status.FAIL, ["GPU 2 does not exist"]),
        ("a100-8x", "-1", Status.WARN, ["hides all 8"]),
        ("cpu-only", "NoDevFiles", Status.PASS, ["none here"]),
        ("a100-8x", "1gpu", Status.WARN, ["read as 1"]),
        ("a100-8x", "GPU-5c0a6e6c", Status.PASS, ["GPU 0 visible"]),
        ("a100-8x", "GPU-5c0a6e6c,GPU-0f1e2d3c", Status.PASS, ["GPU 0, GPU 7 visible"]),
        ("a100-8x", "GPU-deadbeef", Status.FAIL, ["matches no GPU"]),
        ("a100-8x", "GPU-5c0a6e6c,1", Status.FAIL, ["cannot be mixed"]),
        ("a100-mig", "MIG-9f2c4a1e-6b3d-5e8f-a1c2-7d4e9b0f3a21", Status.PASS, ["GPU 0 visible"]),
        ("cpu-only", "0,1", Status.PASS, ["no NVIDIA GPU here"]),
    ],
)
def test_visible_devices(machine, value, status, words):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    result = run(gpu_visible_devices, context(machine, env))
    assert result.status is status, result.summary
    for word in words:
        assert word in result.summary


def test_empty_entries_and_a_missing_gpu_are_both_named():
    result = run(
        gpu_visible_devices, context("workstation-2gpu-busy", {"CUDA_VISIBLE_DEVICES": ",,7"})
    )
    text = " ".join(result.details)
    assert "position 2" in text and "GPU 7 does not exist (this machine has 2 GPUs: 0..1)" in text
    assert "so CUDA sees 0 GPUs" in text
    assert result.fix.startswith("unset CUDA_VISIBLE_DEVICES")
    eight = run(gpu_visible_devices, context("a100-8x", {"CUDA_VISIBLE_DEVICES": ",,7"}))
    assert eight.fix == "export CUDA_VISIBLE_DEVICES=7"


def test_parse_follows_cuda_rules():
    devices = load_machine("a100-8x").gpu.devices
    assert parse_visible_devices("3, 1", devices).ordinals == (3, 1)
    assert parse_visible_devices("0,-1,2", devices).ordinals == (0,)
    assert parse_visible_devices("1,1", devices).ordinals == ()
    assert parse_visible_devices("0,9,1", devices).ordinals == (0,)
    assert parse_visible_devices("+2", devices).ordinals == (2,)
    assert parse_visible_devices("GPU-", devices).errors  # ambiguous prefix
    assert parse_visible_devices("1", None).count is None


# --- gpu.count ---------------------------------------------------------------------------------


def test_count_matches_planned_ranks():
    result = run(gpu_count, context("a100-8x", {"LOCAL_WORLD_SIZE": "8"}))
    assert result.status is Status.PASS
    assert (
        result.summary == "8 GPU(s) visible, 8 rank(s) planned (LOCAL_WORLD_SIZE=8), backend nccl"
    )
    assert result.facts["torch"] == 8


def test_more_ranks_than_gpus_fails():
    result = run(gpu_count, context("a100-8x", options=options(nproc=16)))
    assert result.status is Status.FAIL
    assert "16 ranks planned on this node (--nproc 16) but only 8 GPUs visible" in result.summary
    assert "--nproc-per-node=8" in result.fix


def test_masked_gpus_and_too_many_ranks():
    # CUDA_VISIBLE_DEVICES=1,2 --nproc_per_node=4 on a 2-GPU box: GPU 2 does not exist.
    machine = load_machine("workstation-2gpu-busy")
    env = {"CUDA_VISIBLE_DEVICES": "1,2", "LOCAL_WORLD_SIZE": "4"}
    masked = dataclasses.replace(machine.runtime, device_count=1)  # what torch says there
    result = run(gpu_count, context(machine, env, runtime=masked))
    assert result.status is Status.FAIL
    assert "4 ranks planned on this node (LOCAL_WORLD_SIZE=4) but only 1 GPU visible" in (
        result.summary
    )


def test_nccl_without_gpus_fails_but_auto_uses_gloo():
    failed = run(gpu_count, context("cpu-only", options=options(backend="nccl", nproc=2)))
    assert failed.status is Status.FAIL and "no GPU is visible" in failed.summary
    auto = run(gpu_count, context("cpu-only", options=options(nproc=2)))
    assert auto.status is Status.PASS
    assert auto.summary == "no GPU visible: 2 CPU rank(s) with gloo"


def test_torch_and_nvml_disagree():
    result = run(gpu_count, context("old-driver"))
    assert result.status is Status.FAIL
    assert "torch sees 0 GPU(s) but NVML and CUDA_VISIBLE_DEVICES give 2" in result.summary


def test_fewer_ranks_than_gpus_is_fine():
    result = run(gpu_count, context("a100-8x", options=options(nproc=4)))
    assert result.status is Status.PASS
    assert "4 visible GPU(s) stay idle" in result.details


# --- gpu.devices -------------------------------------------------------------------------------


def test_idle_a100s_pass_with_facts():
    result = run(gpu_devices, context("a100-8x"))
    assert result.status is Status.PASS
    assert result.summary.startswith("8 x NVIDIA A100-SXM4-80GB; 8 used")
    first = result.facts["devices"][0]
    assert first["memory_total_mib"] == 81920 and first["compute_mode"] == "Default"
    assert first["uuid"].startswith("GPU-5c0a6e6c")


def test_busy_gpu_names_the_process_and_memory():
    result = run(gpu_devices, context("workstation-2gpu-busy"))
    assert result.status is Status.FAIL  # 0.8 of 24 GiB free: the job cannot fit
    for word in ("GPU 1 is busy", "pid 48211", "finetune_llama.py", "by alice", "22.8 GiB"):
        assert word in result.summary
    assert "48211" in result.fix


def test_busy_gpu_hidden_by_cuda_visible_devices_is_fine():
    result = run(gpu_devices, context("workstation-2gpu-busy", {"CUDA_VISIBLE_DEVICES": "0"}))
    assert result.status is Status.PASS
    assert any("(hidden)" in d for d in result.details)


def test_busy_gpu_with_room_only_warns():
    machine = load_machine("workstation-2gpu-busy")
    gpu1 = machine.gpu.devices[1]
    roomy = dataclasses.replace(gpu1, memory_free_bytes=gpu1.memory_total_bytes // 2)
    gpu = dataclasses.replace(machine.gpu, devices=(machine.gpu.devices[0], roomy))
    result = run(gpu_devices, context(machine, gpu=gpu))
    assert result.status is Status.WARN and "pid 48211" in result.summary


def test_exclusive_process_gpu_in_use_fails():
    result = run(gpu_devices, context("exclusive-process"))
    assert result.status is Status.FAIL
    assert "GPU 0 is Exclusive_Process and already in use by pid 7731" in result.summary
    assert "busy or unavailable" in result.summary


def test_exclusive_process_shared_by_ranks_fails():
    env = {"CUDA_VISIBLE_DEVICES": "1,2,3"}
    result = run(gpu_devices, context("exclusive-process", env, options=options(nproc=6)))
    assert result.status is Status.FAIL
    assert "2 ranks would share it" in result.summary


def test_prohibited_gpu_fails():
    machine = load_machine("a100-8x")
    devices = list(machine.gpu.devices)
    devices[3] = dataclasses.replace(devices[3], compute_mode="Prohibited")
    gpu = dataclasses.replace(machine.gpu, devices=tuple(devices))
    result = run(gpu_devices, context(machine, gpu=gpu))
    assert result.status is Status.FAIL
    assert "GPU 3 is in compute mode Prohibited" in result.summary
    assert "nvidia-smi -i 3 -c DEFAULT" in result.fix


def test_mig_gpu_warns_and_lists_instances():
    result = run(gpu_devices, context("a100-mig"))
    assert result.status is Status.WARN
    assert "MIG-9f2c4a1e-6b3d-5e8f-a1c2-7d4e9b0f3a21" in result.summary
    assert result.facts["devices"][0]["mig"] is True


def test_mig_without_instances_fails():
    machine = load_machine("a100-mig")
    device = dataclasses.replace(machine.gpu.devices[0], mig_devices=())
    gpu = dataclasses.replace(machine.gpu, devices=(device,))
    result = run(gpu_devices, context(machine, gpu=gpu))
    assert result.status is Status.FAIL and "no MIG instance" in result.summary


def test_no_nvml_skips_devices():
    result = run(gpu_devices, context("cpu-only"))
    assert result.status is Status.SKIP
    assert "NVML Shared Library Not Found" in result.summary


EXPECTED = {
    # machine: statuses of gpu.cuda, gpu.visible_devices, gpu.count, gpu.devices (no env)
    "a100-8x": ("pass", "pass", "pass", "pass"),
    "workstation-2gpu-busy": ("pass", "pass", "pass", "fail"),
    "a100-mig": ("pass", "pass", "pass", "warn"),
    "exclusive-process": ("pass", "pass", "pass", "fail"),
    "cpu-only": ("pass", "pass", "pass", "skip"),
    "old-driver": ("fail", "pass", "fail", "pass"),
}


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_every_recorded_machine(machine):
    ctx = context(machine)
    statuses = tuple(
        run(c, ctx).status.value for c in (gpu_cuda, gpu_visible_devices, gpu_count, gpu_devices)
    )
    assert statuses == EXPECTED[machine]
