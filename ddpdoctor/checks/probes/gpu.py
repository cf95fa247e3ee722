"""GPU facts from NVML and the CUDA driver library, and the InfiniBand HCAs next to them.

Everything is read once, bounded in time, and returned as frozen data. NVML may be missing (no
driver: "NVML Shared Library Not Found"), which is a fact to report, never an exception. The data
classes have a JSON form so that tests (and cross-node reports) can use recorded machines.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

NVML_TIMEOUT_S = 4.0

# As nvidia-smi prints them (nvmlComputeMode_t values 0..3).
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # None where NVML cannot tell (e.g. inside some containers)
    command: str | None = None  # command line (psutil); None when the process is not visible here
    user: str | None = None


@dataclass(frozen=True)
class MigDevice:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    compute_mode: str = "Default"
    mig_enabled: bool | None = None  # None: the GPU does not support MIG
    pci_bus_id: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class IbPort:
    number: int
    state: str  # "ACTIVE", "DOWN", "INIT", ... (from "4: ACTIVE")
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)


@dataclass(frozen=True)
class IbDevice:
    name: str
    ports: tuple[IbPort, ...] = ()

    @property
    def active(self) -> bool:
        return any(p.state == "ACTIVE" for p in self.ports)


@dataclass(frozen=True)
class GpuFacts:
    nvml_error: str | None = None  # why NVML could not be used; None when it answered
    driver_version: str | None = None  # "535.104.05"
    cuda_driver_version: int | None = None  # nvmlSystemGetCudaDriverVersion: 12020 for CUDA 12.2
    devices: tuple[GpuDevice, ...] = ()
    libcuda_path: str | None = None  # the file the loader picks for libcuda.so.1
    libcuda_error: str | None = None
    stub_dirs_on_path: tuple[str, ...] = ()  # LD_LIBRARY_PATH entries holding a stub libcuda

    @property
    def nvml_ok(self) -> bool:
        return self.nvml_error is None

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def cuda_driver(self) -> str | None:
        """The newest CUDA version the driver supports, as "12.2"."""
        return cuda_version_text(self.cuda_driver_version)

    @property
    def libcuda_is_stub(self) -> bool:
        return bool(self.libcuda_path and "/stubs/" in self.libcuda_path)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (lists, not tuples): what from_json reads and reports carry."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuFacts:
        devices = tuple(
            GpuDevice(
                **{
                    **{k: v for k, v in d.items() if k not in ("processes", "mig_devices")},
                    "processes": tuple(GpuProcess(**p) for p in d.get("processes", ())),
                    "mig_devices": tuple(MigDevice(**m) for m in d.get("mig_devices", ())),
                }
            )
            for d in data.get("devices", ())
        )
        plain = {k: v for k, v in data.items() if k not in ("devices", "stub_dirs_on_path")}
        return cls(
            **plain, devices=devices, stub_dirs_on_path=tuple(data.get("stub_dirs_on_path", ()))
        )


def cuda_version_text(code: int | None) -> str | None:
    if not code:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


def ib_devices_from_json(items: list[Mapping[str, Any]]) -> tuple[IbDevice, ...]:
    return tuple(
        IbDevice(name=d["name"], ports=tuple(IbPort(**p) for p in d.get("ports", ())))
        for d in items
    )


class RealGpuProbe:
    """NVML, libcuda and /sys/class/infiniband on this machine; each read once and cached."""

    def __init__(self, timeout_s: float = NVML_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        self._nvml_lock = threading.Lock()
        self._ib_lock = threading.Lock()
        self._facts: GpuFacts | None = None
        self._ib: tuple[IbDevice, ...] | None = None

    def facts(self) -> GpuFacts:
        with self._nvml_lock:
            if self._facts is None:
                self._facts = self._read_bounded()
            return self._facts

    def infiniband(self) -> tuple[IbDevice, ...]:
        with self._ib_lock:
            if self._ib is None:
                self._ib = read_infiniband()
            return self._ib

    def _read_bounded(self) -> GpuFacts:
        # A wedged driver can block an NVML call for minutes: read in a daemon thread and give up
        # at the deadline (the thread cannot keep the doctor alive).
        box: list[GpuFacts] = []
        thread = threading.Thread(target=lambda: box.append(read_gpu_facts()), daemon=True)
        thread.start()
        thread.join(self._timeout_s)
        if box:
            return box[0]
        return GpuFacts(nvml_error=f"NVML did not answer within {self._timeout_s:g} s")


def read_gpu_facts() -> GpuFacts:
    libcuda_path, libcuda_error = resolve_libcuda()
    stubs = stub_dirs_on_library_path(os.environ.get("LD_LIBRARY_PATH", ""))
    try:
        import pynvml
    except ImportError as exc:
        return GpuFacts(
            nvml_error=f"pynvml is not installed ({exc})",
            libcuda_path=libcuda_path,
            libcuda_error=libcuda_error,
            stub_dirs_on_path=stubs,
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return GpuFacts(
            nvml_error=str(exc) or type(exc).__name__,
            libcuda_path=libcuda_path,
            libcuda_error=libcuda_error,
            stub_dirs_on_path=stubs,
        )
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = tuple(_read_device(pynvml, i) for i in range(count))
        return GpuFacts(
            driver_version=_text(_nvml(pynvml, pynvml.nvmlSystemGetDriverVersion)),
            cuda_driver_version=_nvml(pynvml, pynvml.nvmlSystemGetCudaDriverVersion),
            devices=devices,
            libcuda_path=libcuda_path,
            libcuda_error=libcuda_error,
            stub_dirs_on_path=stubs,
        )
    except pynvml.NVMLError as exc:
        return GpuFacts(
            nvml_error=f"NVML failed while listing GPUs: {exc}",
            libcuda_path=libcuda_path,
            libcuda_error=libcuda_error,
            stub_dirs_on_path=stubs,
        )
    finally:
        _nvml(pynvml, pynvml.nvmlShutdown)


def _nvml(pynvml, func, *args):
    """One NVML call; None when this GPU or driver does not support it."""
    try:
        return func(*args)
    except pynvml.NVMLError:
        return None


def _text(value) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _read_device(pynvml, index: int) -> GpuDevice:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = _nvml(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
    mode = _nvml(pynvml, pynvml.nvmlDeviceGetComputeMode, handle)
    mig = _nvml(pynvml, pynvml.nvmlDeviceGetMigMode, handle)
    mig_enabled = None if mig is None else bool(mig[0])
    pci = _nvml(pynvml, pynvml.nvmlDeviceGetPciInfo, handle)
    return GpuDevice(
        index=index,
        name=_text(_nvml(pynvml, pynvml.nvmlDeviceGetName, handle)) or "unknown GPU",
        uuid=_text(_nvml(pynvml, pynvml.nvmlDeviceGetUUID, handle)) or "",
        memory_total_bytes=int(memory.total) if memory else 0,
        memory_used_bytes=int(memory.used) if memory else 0,
        memory_free_bytes=int(memory.free) if memory else 0,
        compute_mode=COMPUTE_MODES.get(mode, f"mode {mode}") if mode is not None else "unknown",
        mig_enabled=mig_enabled,
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        processes=_read_processes(pynvml, handle),
        mig_devices=_read_mig_devices(pynvml, handle) if mig_enabled else (),
    )


def _read_processes(pynvml, handle) -> tuple[GpuProcess, ...]:
    seen: dict[int, GpuProcess] = {}
    for getter in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        for proc in _nvml(pynvml, getter, handle) or ():
            if proc.pid in seen:
                continue
            used = getattr(proc, "usedGpuMemory", None)
            command, user = _describe_pid(proc.pid)
            seen[proc.pid] = GpuProcess(
                pid=int(proc.pid),
                used_memory_bytes=int(used) if isinstance(used, int) else None,
                command=command,
                user=user,
            )
    return tuple(seen.values())


def _describe_pid(pid: int) -> tuple[str | None, str | None]:
    try:
        import psutil

        proc = psutil.Process(pid)
        with proc.oneshot():
            cmdline = " ".join(proc.cmdline()) or proc.name()
            return cmdline[:200], proc.username()
    except Exception:  # noqa: BLE001 - another container's pid, gone, or not ours to inspect
        return None, None


def _read_mig_devices(pynvml, handle) -> tuple[MigDevice, ...]:
    result = []
    for i in range(_nvml(pynvml, pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _nvml(pynvml, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if mig is None:
            continue
        memory = _nvml(pynvml, pynvml.nvmlDeviceGetMemoryInfo, mig)
        result.append(
            MigDevice(
                index=i,
                uuid=_text(_nvml(pynvml, pynvml.nvmlDeviceGetUUID, mig)) or "",
                name=_text(_nvml(pynvml, pynvml.nvmlDeviceGetName, mig)) or "MIG device",
                memory_total_bytes=int(memory.total) if memory else None,
            )
        )
    return tuple(result)


def resolve_libcuda() -> tuple[str | None, str | None]:
    """The file the dynamic loader picks for libcuda.so.1 (as CUDA and NCCL will), or the error.

    Loading the driver library runs no CUDA initialisation; its real path (symlinks resolved) is
    then read from /proc/self/maps, so a stub picked up from LD_LIBRARY_PATH shows as .../stubs/...
    """
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, str(exc)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").split(" ")[-1]
                if os.path.basename(path).startswith("libcuda.so"):
                    return path, None
    except OSError as exc:
        return None, f"loaded, but /proc/self/maps is unreadable: {exc}"
    return None, "loaded, but not found in /proc/self/maps"


def stub_dirs_on_library_path(ld_library_path: str) -> tuple[str, ...]:
    """LD_LIBRARY_PATH entries that hold the CUDA toolkit's compile-time libcuda stub."""
    found = []
    for entry in ld_library_path.split(":"):
        if "stubs" not in entry:
            continue
        for name in ("libcuda.so.1", "libcuda.so"):
            if os.path.exists(os.path.join(entry, name)):
                found.append(entry)
                break
    return tuple(found)


def read_infiniband(root: str = "/sys/class/infiniband") -> tuple[IbDevice, ...]:
    """InfiniBand / RoCE HCAs with their port states, from sysfs (empty when there are none)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return ()
    devices = []
    for name in names:
        ports_dir = os.path.join(root, name, "ports")
        ports = []
        try:
            port_names = sorted(os.listdir(ports_dir), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            port_names = []
        for port in port_names:
            state = _read_small(os.path.join(ports_dir, port, "state"))
            layer = _read_small(os.path.join(ports_dir, port, "link_layer"))
            ports.append(
                IbPort(
                    number=int(port) if port.isdigit() else 0,
                    state=state.split(":")[-1].strip() if state else "unknown",
                    link_layer=layer or "unknown",
                )
            )
        devices.append(IbDevice(name=name, ports=tuple(ports)))
    return tuple(devices)


def _read_small(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(256).strip()
    except OSError:
        return None
