"""What a rank says about itself in its `hello` event: who, where, with which versions."""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from ddpdoctor._version import __version__

ENV_FILLED_FROM = "DDPDOCTOR_ENV_FROM"  # the launcher whose variables ddpdoctor translated
ENV_FILLED = "DDPDOCTOR_ENV_FILLED"  # the names it filled, comma-separated


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def hello_fields(
    *,
    backend: str | None,
    device: str | None,
    script: str | None,
    heartbeat_s: float,
    world_size: int | None = None,
) -> dict[str, Any]:
    """`world_size`: the process group's, once joined (an mp.spawn rank has no $WORLD_SIZE)."""
    fields = {
        "local_rank": env_int("LOCAL_RANK"),
        "world_size": world_size or env_int("WORLD_SIZE"),
        "local_world_size": env_int("LOCAL_WORLD_SIZE"),
        "group_rank": env_int("GROUP_RANK"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "backend": backend,
        "device": device,
        "argv": list(sys.argv),
        "script": script,
        "versions": versions(),
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "restart_count": env_int("TORCHELASTIC_RESTART_COUNT"),
        # torchrun's restart budget (--max-restarts): a failure before it is spent is recovered
        "max_restarts": env_int("TORCHELASTIC_MAX_RESTARTS"),
        "heartbeat_s": heartbeat_s,
        "parent": parent_of(os.getppid()),
    }
    fields.update(env_filled(os.environ))
    ray = ray_facts()
    if ray is not None:
        fields["ray"] = ray
    return fields


def ray_facts() -> dict[str, Any] | None:
    """Who the rank is to Ray (its actor's name and class, node, job), in a Ray worker."""
    if "ray" not in sys.modules:
        return None
    from ddpdoctor.runtime import ray_identity

    return ray_identity.facts()


def env_filled(env: Mapping[str, str]) -> dict[str, Any]:
    """Which of torch's variables ddpdoctor filled in from a launcher's (autostart.py): the hello
    event's {"env_from": "slurm", "env_filled": [...]}, or {}."""
    source = env.get(ENV_FILLED_FROM)
    if not source:
        return {}
    return {"env_from": source, "env_filled": [n for n in env.get(ENV_FILLED, "").split(",") if n]}


def parent_of(ppid: int) -> dict[str, Any]:
    """The process that started this rank (the launcher: torchrun's agent, an mp.spawn parent,
    slurmstepd, mpirun's daemon), from /proc: {"pid", "argv"}; argv empty where unreadable."""
    argv: list[str] = []
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
        argv = [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]
    except OSError:
        pass
    return {"pid": ppid, "argv": argv}


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": None,
        "ddpdoctor": __version__,
        "nccl": None,
        "cuda": None,
    }
    torch = sys.modules.get("torch")  # the runtime imports torch before it says hello
    if torch is None:
        return found
    found["torch"] = getattr(torch, "__version__", None)
    found["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        nccl = torch.cuda.nccl.version()
        found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - a CPU-only build has no NCCL
        pass
    return found


def process_group_facts() -> tuple[int | None, int | None, str | None, int | None]:
    """(rank, world size, backend, CUDA device index) once a process group exists."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None, None, None, None
    rank = dist.get_rank()
    world = dist.get_world_size()
    try:
        backend = str(dist.get_backend())
    except Exception:  # noqa: BLE001
        backend = None
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    return rank, world, backend, device
