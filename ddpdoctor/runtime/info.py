"""What a rank says about itself in its `hello` event: who, where, with which versions."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from ddpdoctor._version import __version__


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def hello_fields(
    *, backend: str | None, device: str | None, script: str | None, heartbeat_s: float
) -> dict[str, Any]:
    return {
        "local_rank": env_int("LOCAL_RANK"),
        "world_size": env_int("WORLD_SIZE"),
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
        "heartbeat_s": heartbeat_s,
    }


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
