"""What the planned job will get from this machine's GPUs: the devices it sees and its backend.

Several checks (launcher, gpu, nccl) need the same answers, worked out from the GPU probe and
CUDA_VISIBLE_DEVICES in ctx.env; they are computed here, once per question, never from os.environ.
"""

from __future__ import annotations

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.cuda_visible import Visibility, parse_visible_devices


def visibility(ctx: CheckContext) -> Visibility:
    facts = ctx.probes.gpu.facts()
    devices = facts.devices if facts.nvml_ok else None
    return parse_visible_devices(ctx.env.get("CUDA_VISIBLE_DEVICES"), devices)


def visible_gpu_count(ctx: CheckContext) -> int:
    """GPUs the job's processes will see (0 when NVML finds none)."""
    count = visibility(ctx).count
    return count or 0


def job_backend(ctx: CheckContext) -> str:
    """ "nccl" or "gloo": as asked, or (auto) nccl when GPUs are visible."""
    return ctx.plan.resolved_backend(visible_gpu_count(ctx))


def no_gpu_reason(ctx: CheckContext) -> str | None:
    """Why the job will see no GPU at all ("no NVIDIA driver (libcuda.so.1 ...)",
    "CUDA_VISIBLE_DEVICES hides every GPU", "NVML finds no GPU"), or None when it may see one.
    Only a certain answer counts: NVML unavailable with a loadable driver says nothing."""
    facts = ctx.probes.gpu.facts()
    seen = visibility(ctx)
    if seen.count == 0:
        if seen.raw is not None and seen.raw.strip() != "" and facts.count:
            return f"CUDA_VISIBLE_DEVICES={seen.raw} hides every GPU"
        if facts.nvml_ok:
            return "NVML finds no GPU"
    if not facts.nvml_ok and facts.libcuda_path is None:
        why = facts.libcuda_error or facts.nvml_error or "not found"
        return f"no NVIDIA driver ({why})"
    return None
