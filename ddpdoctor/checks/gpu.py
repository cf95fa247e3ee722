"""GPU checks: CUDA and the driver, CUDA_VISIBLE_DEVICES, device counts, and each device's state.

Failure modes F04 (more ranks than visible GPUs, CUDA_VISIBLE_DEVICES mistakes), F21 (busy GPUs,
exclusive or prohibited compute mode) and F26 (the libcuda stub, a driver older than torch's CUDA).
Without a GPU these checks say so and the job runs on gloo; torch is imported (in a subprocess)
only when NVML has found GPUs.
"""

from __future__ import annotations

import os

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.gpu_plan import job_backend, visibility
from ddpdoctor.checks.model import CheckOutcome, failed, passed, skipped, warning
from ddpdoctor.checks.probes.gpu import GpuDevice, GpuFacts
from ddpdoctor.checks.probes.torch_facts import TorchFacts
from ddpdoctor.checks.problems import Problem, outcome_from
from ddpdoctor.checks.registry import check

GIB = 1024**3
# Oldest Linux driver for each CUDA major version (CUDA toolkit release notes, table 3).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# CUDA builds published on download.pytorch.org, to name one the installed driver can run.
TORCH_CUDA_BUILDS = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
BUSY_FREE_FRACTION = 0.10  # less free memory than this on a GPU the job needs: it will not fit


@check("gpu.cuda", "CUDA and driver", timeout_s=30)
def gpu_cuda(ctx: CheckContext) -> CheckOutcome:
    gpu = ctx.probes.gpu.facts()
    torch = ctx.probes.torch.facts()
    facts = {
        "torch": torch.version,
        "torch_cuda": torch.cuda,
        "driver": gpu.driver_version,
        "driver_cuda": gpu.cuda_driver,
        "gpus": gpu.count,
        "nvml": gpu.nvml_error or "ok",
        "libcuda": gpu.libcuda_path or gpu.libcuda_error,
    }
    if not torch.installed:
        return failed(
            f"torch is not installed ({torch.error})",
            fix="pip install torch (see https://pytorch.org/get-started/locally/)",
            facts=facts,
        )
    problems = _libcuda_problems(gpu)
    build = f"torch {torch.version} ({_build_name(torch)})"
    if gpu.count == 0:
        why = f"NVML: {gpu.nvml_error}" if gpu.nvml_error else "NVML lists no device"
        return outcome_from(
            problems,
            ok_summary=f"no NVIDIA GPU ({why}); {build} will run DDP with gloo on the CPU",
            facts=facts,
        )
    if torch.cuda is None and not torch.hip:
        problems.append(
            Problem(
                f"{build} cannot use the {gpu.count} GPU(s) of this machine: the job will "
                "run on the CPU with gloo",
                fix=f"install a CUDA build of torch: {_torch_install_hint(gpu)}",
                fatal=False,
            )
        )
        return outcome_from(problems, ok_summary=build, facts=facts)
    problems += _driver_problems(gpu, torch)
    details = [f"driver {gpu.driver_version} supports CUDA up to {gpu.cuda_driver}"]
    if visibility(ctx).count == 0:
        details.append("CUDA_VISIBLE_DEVICES hides every GPU (see gpu.visible_devices)")
        return outcome_from(problems, ok_summary=build, details=details, facts=facts)
    runtime = ctx.probes.torch.runtime(ctx.env)
    facts["torch_cuda_available"] = runtime.cuda_available
    facts["torch_device_count"] = runtime.device_count
    if runtime.error:
        problems.append(
            Problem(
                f"torch could not be asked about CUDA: {runtime.error}",
                fix="run `python -c 'import torch; print(torch.cuda.is_available())'` to see why",
            )
        )
    elif not runtime.cuda_available:
        problems.append(
            Problem(
                f"NVML sees {gpu.count} GPU(s) but torch.cuda.is_available() is False",
                fix=f"check `nvidia-smi`, that driver {gpu.driver_version} supports CUDA "
                f"{torch.cuda}, and that the job can open /dev/nvidia* (containers: --gpus all)",
            )
        )
    summary = (
        f"{build}, driver {gpu.driver_version} (CUDA {gpu.cuda_driver}); "
        f"torch sees {runtime.device_count} GPU(s)"
    )
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _build_name(torch: TorchFacts) -> str:
    if torch.cuda:
        return f"CUDA {torch.cuda} build"
    if torch.hip:
        return f"ROCm {torch.hip} build"
    return "CPU-only build"


def _libcuda_problems(gpu: GpuFacts) -> list[Problem]:
    if gpu.libcuda_is_stub:
        stub_dir = os.path.dirname(gpu.libcuda_path or "")
        return [
            Problem(
                f"libcuda.so.1 resolves to the CUDA toolkit's compile-time stub "
                f"{gpu.libcuda_path}: CUDA calls fail with 'CUDA driver is a stub library' (F26)",
                fix=f"remove {stub_dir} from LD_LIBRARY_PATH; the real libcuda.so.1 comes with "
                "the NVIDIA driver (e.g. /usr/lib/x86_64-linux-gnu)",
            )
        ]
    if gpu.stub_dirs_on_path and gpu.count:
        return [
            Problem(
                f"LD_LIBRARY_PATH contains the libcuda stub directory "
                f"{', '.join(gpu.stub_dirs_on_path)}: where the driver's libcuda is missing "
                "(containers, other nodes), the stub is loaded instead (F26)",
                fix="remove the .../stubs directory from LD_LIBRARY_PATH; it is only for linking",
                fatal=False,
            )
        ]
    return []


def _driver_problems(gpu: GpuFacts, torch: TorchFacts) -> list[Problem]:
    driver = _version_pair(gpu.cuda_driver)
    built = _version_pair(torch.cuda)
    if not driver or not built or driver >= built:
        return []
    if driver[0] < built[0]:
        minimum = MIN_DRIVER.get(built[0])
        need = f" ({minimum} or newer)" if minimum else ""
        return [
            Problem(
                f"driver {gpu.driver_version} supports CUDA up to {gpu.cuda_driver}, but torch "
                f"{torch.version} is built for CUDA {torch.cuda}: CUDA will not initialise (F26)",
                fix=f"upgrade the NVIDIA driver to one for CUDA {built[0]}{need}, or "
                f"{_torch_install_hint(gpu)}",
            )
        ]
    # Same major version: CUDA's minor-version compatibility runs it; only PTX JIT can fail.
    return []


def _version_pair(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _torch_install_hint(gpu: GpuFacts) -> str:
    driver = _version_pair(gpu.cuda_driver)
    # CUDA minor-version compatibility: a driver for CUDA X.y runs builds for any X.z.
    fitting = [b for b in TORCH_CUDA_BUILDS if driver is None or b[0] <= driver[0]]
    if not fitting:
        return "install a torch build for an older CUDA version"
    major, minor = fitting[-1]
    return (
        f"install a torch build for CUDA {major}.{minor}: pip install torch "
        f"--index-url https://download.pytorch.org/whl/cu{major}{minor}"
    )


@check("gpu.visible_devices", "CUDA_VISIBLE_DEVICES")
def gpu_visible_devices(ctx: CheckContext) -> CheckOutcome:
    gpu = ctx.probes.gpu.facts()
    seen = visibility(ctx)
    raw = seen.raw
    facts = {
        "value": raw,
        "entries": list(seen.entries),
        "visible": list(seen.ordinals) if seen.ordinals is not None else None,
        "nvml_count": gpu.count if gpu.nvml_ok else None,
    }
    if raw is None:
        if gpu.count:
            return passed(f"unset: all {gpu.count} GPU(s) visible", facts=facts)
        return passed("unset (no GPU here)", facts=facts)
    if seen.hides_all_on_purpose:
        if not gpu.count:
            return passed(f"CUDA_VISIBLE_DEVICES={raw} hides every GPU (none here)", facts=facts)
        return warning(
            f"CUDA_VISIBLE_DEVICES={raw} hides all {gpu.count} GPU(s): the job will use gloo "
            "on the CPU",
            fix="unset CUDA_VISIBLE_DEVICES, or under Slurm request GPUs (srun --gres=gpu:N)",
            facts=facts,
        )
    if seen.errors:
        return failed(
            f"CUDA_VISIBLE_DEVICES={raw!r}: {seen.errors[0]}"
            + (f" (and {len(seen.errors) - 1} more)" if len(seen.errors) > 1 else ""),
            fix=_visible_fix(seen.raw or "", gpu),
            details=(*seen.errors, _leaves(seen.count)),
            facts=facts,
        )
    if seen.notes:
        return warning(
            f"CUDA_VISIBLE_DEVICES={raw!r}: {seen.notes[0]}",
            fix=f"write plain ids: export CUDA_VISIBLE_DEVICES={','.join(seen.entries)}",
            details=seen.notes,
            facts=facts,
        )
    if seen.ordinals is None:
        return passed(
            f"CUDA_VISIBLE_DEVICES={raw} (no NVIDIA GPU here to check the ids against)",
            facts=facts,
        )
    names = ", ".join(f"GPU {i}" for i in seen.ordinals)
    return passed(f"CUDA_VISIBLE_DEVICES={raw}: {names} visible", facts=facts)


def _leaves(count: int | None) -> str:
    if count is None:
        return "without NVML the ids cannot be checked against the GPUs"
    return f"so CUDA sees {count} GPU{'s' if count != 1 else ''}"


def _visible_fix(raw: str, gpu: GpuFacts) -> str:
    """A corrected value: the entries that name real GPUs, once each, in the given order."""
    keep: list[str] = []
    for item in raw.split(","):
        text = item.strip()
        if not text or text in keep:
            continue
        if text.isdigit() and gpu.nvml_ok and int(text) >= gpu.count:
            continue
        if text.isdigit() or text.startswith(("GPU-", "MIG-")):
            keep.append(text)
    if not keep:
        return "unset CUDA_VISIBLE_DEVICES (or list real GPU ids, e.g. 0,1)"
    hint = "" if gpu.nvml_ok else " (the ids are not checked: no NVML here)"
    return f"export CUDA_VISIBLE_DEVICES={','.join(keep)}{hint}"


@check("gpu.count", "GPU count", timeout_s=30)
def gpu_count(ctx: CheckContext) -> CheckOutcome:
    gpu = ctx.probes.gpu.facts()
    seen = visibility(ctx)
    visible = seen.count or 0
    backend = job_backend(ctx)
    planned = ctx.plan.nproc_per_node
    facts: dict[str, object] = {
        "nvml": gpu.count if gpu.nvml_ok else None,
        "visible": visible,
        "planned_per_node": planned,
        "backend": backend,
    }
    problems: list[Problem] = []
    details: list[str] = []
    if visible > 0:
        runtime = ctx.probes.torch.runtime(ctx.env)
        facts["torch"] = None if runtime.error else runtime.device_count
        if runtime.error:
            details.append(f"torch.cuda.device_count() unknown: {runtime.error}")
        elif runtime.device_count != visible:
            problems.append(
                Problem(
                    f"torch sees {runtime.device_count} GPU(s) but NVML and "
                    f"CUDA_VISIBLE_DEVICES give {visible}",
                    fix="check CUDA_VISIBLE_DEVICES and the driver (`nvidia-smi`); in a "
                    "container, pass the GPUs through (--gpus all)",
                )
            )
    source = _planned_source(ctx)
    if backend == "nccl":
        if visible == 0:
            problems.append(
                Problem(
                    "backend nccl needs one GPU per rank, but no GPU is visible",
                    fix="use --backend gloo for CPU ranks, or run on a node with visible GPUs",
                )
            )
        elif planned and planned > visible:
            problems.append(
                Problem(
                    f"{planned} ranks planned on this node ({source}) but only {visible} GPU"
                    f"{'s' if visible != 1 else ''} visible: ranks {visible}..{planned - 1} "
                    "fail with 'invalid device ordinal' or share a GPU (F04)",
                    fix=f"use --nproc-per-node={visible} (or --nproc-per-node=gpu), or make "
                    f"{planned} GPUs visible",
                )
            )
        elif planned and planned < visible:
            details.append(f"{visible - planned} visible GPU(s) stay idle")
    if visible == 0:
        ranks = f"{planned} CPU rank(s)" if planned else "CPU ranks"
        summary = f"no GPU visible: {ranks} with {backend}"
    else:
        summary = f"{visible} GPU(s) visible"
        if gpu.count != visible:
            summary += f" of {gpu.count}"
        summary += f", {planned} rank(s) planned ({source})" if planned else ""
        summary += f", backend {backend}"
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _planned_source(ctx: CheckContext) -> str:
    if ctx.options.nproc:
        return f"--nproc {ctx.options.nproc}"
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if name in ctx.env:
            return f"{name}={ctx.env[name]}"
    return "not planned"


@check("gpu.devices", "GPU devices", timeout_s=10)
def gpu_devices(ctx: CheckContext) -> CheckOutcome:
    gpu = ctx.probes.gpu.facts()
    if not gpu.nvml_ok:
        return skipped(f"no NVIDIA GPU (NVML: {gpu.nvml_error})")
    if not gpu.devices:
        return skipped("NVML lists no GPU")
    seen = visibility(ctx)
    used = set(seen.ordinals) if seen.ordinals is not None else {d.index for d in gpu.devices}
    visible = len(used)
    planned = ctx.plan.nproc_per_node or visible
    ranks_per_gpu = -(-planned // visible) if visible else 0
    problems: list[Problem] = []
    details: list[str] = []
    for device in gpu.devices:
        details.append(_describe(device) + ("" if device.index in used else " (hidden)"))
        if device.index in used:
            problems += _device_problems(device, ranks_per_gpu)
    facts = {"devices": [_device_facts(d) for d in gpu.devices], "used": sorted(used)}
    names = sorted({d.name for d in gpu.devices})
    summary = f"{gpu.count} x {', '.join(names)}; {visible} used, all free and usable"
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _describe(device: GpuDevice) -> str:
    mig = {None: "", True: ", MIG on", False: ", MIG off"}[device.mig_enabled]
    procs = f", {len(device.processes)} process(es)" if device.processes else ""
    return (
        f"GPU {device.index}: {device.name} {device.uuid}, "
        f"{device.memory_free_bytes / GIB:.1f} of {device.memory_total_bytes / GIB:.1f} GiB free, "
        f"{device.compute_mode}{mig}{procs}"
    )


def _process_list(device: GpuDevice) -> str:
    parts = []
    for proc in device.processes:
        who = f" by {proc.user}" if proc.user else ""
        what = f" ({proc.command})" if proc.command else ""
        mem = (
            f", {proc.used_memory_bytes / GIB:.1f} GiB"
            if proc.used_memory_bytes is not None
            else ""
        )
        parts.append(f"pid {proc.pid}{what}{who}{mem}")
    return "; ".join(parts)


def _device_problems(device: GpuDevice, ranks_per_gpu: int) -> list[Problem]:
    i = device.index
    problems: list[Problem] = []
    elsewhere = f"or leave GPU {i} out with CUDA_VISIBLE_DEVICES"
    if device.compute_mode == "Prohibited":
        problems.append(
            Problem(
                f"GPU {i} is in compute mode Prohibited: no process may use it (F21)",
                fix=f"sudo nvidia-smi -i {i} -c DEFAULT, {elsewhere}",
            )
        )
    exclusive = device.compute_mode in ("Exclusive_Process", "Exclusive_Thread")
    if exclusive and device.processes:
        problems.append(
            Problem(
                f"GPU {i} is {device.compute_mode} and already in use by "
                f"{_process_list(device)}: the job fails with 'all CUDA-capable devices are "
                "busy or unavailable' (F21)",
                fix=f"stop {', '.join(str(p.pid) for p in device.processes)} (kill <pid>), "
                f"{elsewhere}",
            )
        )
    elif exclusive and ranks_per_gpu > 1:
        problems.append(
            Problem(
                f"GPU {i} is {device.compute_mode} but {ranks_per_gpu} ranks would share it",
                fix="start one rank per GPU (--nproc-per-node = number of GPUs), or "
                f"sudo nvidia-smi -i {i} -c DEFAULT",
            )
        )
    elif device.processes:
        tight = device.memory_free_bytes < BUSY_FREE_FRACTION * device.memory_total_bytes
        problems.append(
            Problem(
                f"GPU {i} is busy: {_process_list(device)}; "
                f"{device.memory_free_bytes / GIB:.1f} of "
                f"{device.memory_total_bytes / GIB:.1f} GiB free (F21)",
                fix=f"stop leftover processes ({', '.join(str(p.pid) for p in device.processes)}) "
                f"or pick free GPUs, {elsewhere}",
                fatal=tight,
            )
        )
    if device.mig_enabled:
        problems += _mig_problems(device)
    return problems


def _mig_problems(device: GpuDevice) -> list[Problem]:
    i = device.index
    if not device.mig_devices:
        return [
            Problem(
                f"GPU {i} has MIG enabled but no MIG instance: CUDA finds no device on it",
                fix=f"create instances (sudo nvidia-smi mig -i {i} -cgi 9,9 -C) or disable MIG "
                f"(sudo nvidia-smi -i {i} -mig 0)",
            )
        ]
    instances = ", ".join(f"{m.name} {m.uuid}" for m in device.mig_devices)
    return [
        Problem(
            f"GPU {i} has MIG enabled ({instances}): each rank needs its own instance, and "
            "MIG instances have no P2P/NVLink between them, so NCCL falls back to slower paths",
            fix="give each rank one instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>), or disable MIG "
            f"for multi-GPU training (sudo nvidia-smi -i {i} -mig 0)",
            fatal=False,
        )
    ]


def _device_facts(device: GpuDevice) -> dict[str, object]:
    return {
        "index": device.index,
        "name": device.name,
        "uuid": device.uuid,
        "memory_total_mib": device.memory_total_bytes // 2**20,
        "memory_free_mib": device.memory_free_bytes // 2**20,
        "compute_mode": device.compute_mode,
        "mig": device.mig_enabled,
        "mig_devices": [m.uuid for m in device.mig_devices],
        "processes": [
            {"pid": p.pid, "command": p.command, "user": p.user, "used_bytes": p.used_memory_bytes}
            for p in device.processes
        ],
    }
