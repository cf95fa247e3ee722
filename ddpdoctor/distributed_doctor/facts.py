"""What each rank tells the others about itself: versions, NCCL/GLOO settings, interfaces, GPU.

Rank 0 compares these across the job (consistency.py). Collection needs torch, which the
distributed doctor has imported anyway to build its process group; each fact is best effort and
a fact that cannot be read is None, never an exception.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ddpdoctor._version import __version__

# Variables compared across ranks: every NCCL_* and GLOO_*, and these launch variables (F07).
COMPARED_PREFIXES = ("NCCL_", "GLOO_")
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
RESOLVE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RankFacts:
    rank: int
    local_rank: int
    node_rank: int | None
    host: str
    pid: int
    boot_id: str | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)  # NCCL_*, GLOO_* and launch variables
    interfaces: tuple[str, ...] = ()  # names of interfaces that are up and have an address
    gpu_uuid: str | None = None  # the GPU this rank would use; None without GPUs
    master_addr: str = ""
    master_resolved: tuple[str, ...] = ()
    master_error: str | None = None  # why MASTER_ADDR could not be resolved or reached
    master_connect_ms: float | None = None  # time to open a TCP connection to the store
    # how long MASTER_ADDR did not resolve before it did (a name that appears late); None: at once
    master_name_wait_s: float | None = None
    master_var: str = "MASTER_ADDR"  # the variable the user set it with (PET_MASTER_ADDR in a pod)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["versions"] = dict(self.versions)
        data["env"] = dict(self.env)
        data["interfaces"] = list(self.interfaces)
        data["master_resolved"] = list(self.master_resolved)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankFacts:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["interfaces"] = tuple(known.get("interfaces") or ())
        known["master_resolved"] = tuple(known.get("master_resolved") or ())
        return cls(**known)


def collect_rank_facts(
    *,
    rank: int,
    local_rank: int,
    node_rank: int | None,
    master_addr: str,
    master_port: int,
    env: Mapping[str, str],
    master_connect_ms: float | None = None,
    interfaces: Callable[[], list[Any]] | None = None,
    gpu_uuid: Callable[[int], str | None] | None = None,
    resolved: tuple[str, ...] | None = None,
    master_var: str = "MASTER_ADDR",
) -> RankFacts:
    """`resolved`: what the join already resolved MASTER_ADDR to (not looked up again)."""
    if resolved is not None:
        resolved, error = tuple(sorted(set(resolved))), None
    else:
        resolved, error = resolve(master_addr, master_port)
    return RankFacts(
        rank=rank,
        local_rank=local_rank,
        node_rank=node_rank,
        host=socket.gethostname(),
        pid=os.getpid(),
        boot_id=boot_id(),
        versions=software_versions(),
        env=compared_env(env),
        interfaces=_interface_names(interfaces),
        gpu_uuid=(gpu_uuid or torch_gpu_uuid)(local_rank),
        master_addr=master_addr,
        master_resolved=resolved,
        master_error=error,
        master_connect_ms=master_connect_ms,
        master_var=master_var,
    )


def boot_id() -> str | None:
    """Same on every process of one running kernel: tells two machines from two launchers."""
    return _read("/proc/sys/kernel/random/boot_id")


def compared_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in sorted(env.items()) if k.startswith(COMPARED_PREFIXES) or k in LAUNCH_VARS
    }


def software_versions() -> dict[str, str | None]:
    """torch, CUDA (the build's), NCCL, driver, Python and ddpdoctor versions."""
    versions: dict[str, str | None] = {
        "torch": None,
        "cuda": None,
        "nccl": None,
        "driver": nvml_driver_version(),
        "python": platform.python_version(),
        "ddpdoctor": __version__,
    }
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        versions["nccl"] = _nccl_version(torch)
    except Exception:  # noqa: BLE001 - a missing fact is reported as unknown
        pass
    return versions


def _nccl_version(torch: Any) -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU-only builds have no NCCL
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def nvml_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library (no NVIDIA driver) on this host
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def torch_gpu_uuid(local_rank: int) -> str | None:
    """UUID of the GPU torch would give this rank (cuda:LOCAL_RANK), as NVML prints it."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        device = local_rank % torch.cuda.device_count()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 - no usable GPU: the job runs on the CPU
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def resolve(host: str, port: int) -> tuple[tuple[str, ...], str | None]:
    """The addresses `host` resolves to here, bounded in time (a dead DNS server must not hang)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            box["addrs"] = tuple(sorted({str(info[4][0]) for info in infos}))
        except OSError as exc:
            box["error"] = f"does not resolve: {exc.strerror or exc}"

    thread = threading.Thread(target=work, name="ddpdoctor-resolve", daemon=True)
    thread.start()
    thread.join(RESOLVE_TIMEOUT_S)
    if thread.is_alive():
        return (), f"name lookup did not answer within {RESOLVE_TIMEOUT_S:g} s"
    return box.get("addrs", ()), box.get("error")


def _interface_names(interfaces: Callable[[], list[Any]] | None) -> tuple[str, ...]:
    try:
        if interfaces is None:
            from ddpdoctor.checks.probes.net import RealNetProbe

            interfaces = RealNetProbe().interfaces
        return tuple(i.name for i in interfaces() if i.up and i.addresses)
    except Exception:  # noqa: BLE001 - psutil missing or broken: no interface facts
        return ()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
