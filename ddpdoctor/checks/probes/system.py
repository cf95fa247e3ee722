"""Host facts: resource limits, CPUs, memory, shared-memory segments, py-spy and ptrace permission.

The parsers of /proc text (`ptrace_from_text`, `parse_cpu_max`, ...) are pure functions so tests
can feed recorded files; the probe only reads the real ones.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_PTRACE = 19  # bit number in the CapEff mask (linux/capability.h)
SHM_SEGMENT = re.compile(r"^(nccl-[A-Za-z0-9]+|torch_(\d+)_\w+)$")


@dataclass(frozen=True)
class Limits:
    nofile_soft: int | None  # None: unlimited
    nofile_hard: int | None
    memlock_soft: int | None  # bytes
    memlock_hard: int | None


@dataclass(frozen=True)
class CpuInfo:
    usable: int  # CPUs this process may run on (sched_getaffinity: taskset, cpuset, Slurm)
    online: int
    quota: float | None = None  # a cgroup CPU quota in CPUs (docker --cpus), when one is set


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class ShmSegment:
    name: str
    size: int
    owner_pid: int | None  # torch_<pid>_... names carry their creator's pid; nccl-* do not
    in_use: bool  # a live process maps or holds it open (or its creator is still alive)


@dataclass(frozen=True)
class PySpyInfo:
    path: str | None
    version: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class PtraceInfo:
    yama_scope: int | None  # /proc/sys/kernel/yama/ptrace_scope; None when Yama is absent
    cap_sys_ptrace: bool
    is_root: bool
    seccomp: int | None = None  # /proc/self/status Seccomp: 0 none, 1 strict, 2 filter


class RealSystemProbe:
    def limits(self) -> Limits:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return Limits(*(_limit(v) for v in (*nofile, *memlock)))

    def infiniband_devices(self) -> tuple[str, ...]:
        try:
            return tuple(sorted(os.listdir("/sys/class/infiniband")))
        except OSError:
            return ()

    def cpus(self) -> CpuInfo:
        try:
            usable = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            usable = os.cpu_count() or 1
        return CpuInfo(usable, os.cpu_count() or usable, _cgroup_cpu_quota())

    def memory(self) -> MemoryInfo:
        import psutil

        vm = psutil.virtual_memory()
        return MemoryInfo(int(vm.total), int(vm.available))

    def shm_segments(self, directory: str = "/dev/shm") -> tuple[ShmSegment, ...]:
        """NCCL and torch shared-memory segments in `directory` and whether anyone still uses them."""
        try:
            names = [n for n in os.listdir(directory) if SHM_SEGMENT.match(n)]
        except OSError:
            return ()
        if not names:
            return ()
        held = _paths_held_open(directory)
        segments = []
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            match = SHM_SEGMENT.match(name)
            owner = int(match.group(2)) if match and match.group(2) else None
            # Another user's processes' maps are hidden from a non-root user: assume in use.
            unseen = st.st_uid != os.geteuid() and os.geteuid() != 0
            in_use = path in held or unseen or (owner is not None and _pid_alive(owner))
            size = st.st_size
            segments.append(ShmSegment(name, size, owner, in_use))
        return tuple(segments)

    def pyspy(self, path_env: str | None) -> PySpyInfo:
        """py-spy on PATH, else next to this Python (an unactivated venv), and its version."""
        found = shutil.which("py-spy", path=path_env) if path_env else None
        if found is None:
            beside = Path(sys.executable).parent / "py-spy"
            if beside.is_file() and os.access(beside, os.X_OK):
                found = str(beside)
        if found is None:
            return PySpyInfo(None, error="not found")
        try:
            out = subprocess.run(
                [found, "--version"], capture_output=True, text=True, timeout=5, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return PySpyInfo(found, error=str(exc))
        text = (out.stdout or out.stderr).strip()
        if out.returncode != 0:
            return PySpyInfo(found, error=text or f"exit code {out.returncode}")
        return PySpyInfo(found, version=text.split()[-1] if text else None)

    def ptrace(self) -> PtraceInfo:
        return ptrace_from_text(
            _read("/proc/self/status") or "",
            _read("/proc/sys/kernel/yama/ptrace_scope"),
            os.geteuid(),
        )


def ptrace_from_text(status_text: str, yama_text: str | None, euid: int) -> PtraceInfo:
    """PtraceInfo from /proc/self/status, /proc/sys/kernel/yama/ptrace_scope and the euid."""
    fields = dict(
        line.split(":", 1) for line in status_text.splitlines() if ":" in line
    )  # "CapEff:\t000001ffffffffff"
    try:
        cap_eff = int(fields.get("CapEff", "0").strip(), 16)
    except ValueError:
        cap_eff = 0
    try:
        seccomp: int | None = int(fields["Seccomp"].strip())
    except (KeyError, ValueError):
        seccomp = None
    try:
        scope = int(yama_text.strip()) if yama_text is not None else None
    except ValueError:
        scope = None
    return PtraceInfo(scope, bool(cap_eff >> CAP_SYS_PTRACE & 1), euid == 0, seccomp)


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max ("200000 100000" = 2 CPUs, "max 100000" = no quota)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return int(parts[0]) / int(parts[1])
    except (ValueError, ZeroDivisionError):
        return None


def _cgroup_cpu_quota() -> float | None:
    text = _read("/sys/fs/cgroup/cpu.max")
    if text is not None:
        return parse_cpu_max(text)
    quota, period = (
        _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    if quota is None or period is None or quota.strip() == "-1":
        return None
    return parse_cpu_max(f"{quota.strip()} {period.strip()}")


def _paths_held_open(directory: str) -> set[str]:
    """Paths under `directory` that some process maps or holds open (/proc/*/maps and fd links)."""
    prefix = directory.rstrip("/") + "/"
    held: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        maps = _read(f"/proc/{pid}/maps", limit=8 << 20) or ""
        for line in maps.splitlines():
            i = line.find(prefix)
            if i >= 0:
                held.add(line[i:].removesuffix(" (deleted)"))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                held.add(target)
    return held


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _limit(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else int(value)


def _read(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None
