"""What the installed torch offers, read WITHOUT importing it.

`import torch` costs seconds; the doctor must answer in about one. So the facts come from the files
torch ships: its version and CUDA build from torch/version.py (parsed, not executed), whether it is
a CUDA build from torch/lib/libtorch_cuda.so, which libnccl it links from that library's ELF headers,
and the NCCL version by loading that same libnccl with ctypes and calling ncclGetVersion (no CUDA
initialisation). torch's own view (`torch.cuda.device_count()`, ...) costs a subprocess that imports
torch; checks ask for it only when the GPU probe has found GPUs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ddpdoctor.checks.probes.elf_deps import read_dynamic_info

NCCL_SONAME = "libnccl.so.2"
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl")
RUNTIME_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class TorchFacts:
    installed: bool
    version: str | None = None  # "2.14.1+cu130"
    location: str | None = None  # the torch package directory
    cuda: str | None = None  # torch.version.cuda: "13.0"; None for CPU-only builds
    hip: str | None = None  # torch.version.hip for ROCm builds
    cuda_libs: bool = False  # libtorch_cuda.so is present
    platform: str = "linux"  # sys.platform
    nccl_linkage: str = "none"  # "dynamic" (libnccl.so.2), "static" (inside libtorch_cuda), "none"
    nccl_library: str | None = None  # the libnccl file torch would load
    nccl_version: str | None = None  # "2.30.7", from ncclGetVersion
    nccl_error: str | None = None  # why the version could not be read
    nccl_package: str | None = None  # "nvidia-nccl-cu13"
    nccl_package_version: str | None = None
    nccl_required: str | None = None  # torch's own pin: "nvidia-nccl-cu13==2.30.7"
    error: str | None = None

    @property
    def nccl_built_in(self) -> bool:
        """torch.distributed.is_nccl_available(), as far as the files tell."""
        if self.platform != "linux":
            return False
        if self.hip:
            return True  # ROCm builds provide the "nccl" backend through RCCL
        return self.cuda_libs and self.nccl_linkage != "none"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchFacts:
        return cls(**data)


@dataclass(frozen=True)
class TorchRuntime:
    """torch's own answers, from a subprocess that imports it (with the job's environment)."""

    cuda_available: bool = False
    device_count: int = 0
    nccl_available: bool = False
    nccl_version: str | None = None
    error: str | None = None
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchRuntime:
        return cls(**data)


class RealTorchProbe:
    def __init__(self) -> None:
        # Two locks: checks reading the cheap facts must not wait for the torch subprocess.
        self._facts_lock = threading.Lock()
        self._runtime_lock = threading.Lock()
        self._facts: TorchFacts | None = None
        self._runtime: dict[tuple[tuple[str, str], ...], TorchRuntime] = {}

    def facts(self) -> TorchFacts:
        with self._facts_lock:
            if self._facts is None:
                self._facts = read_torch_facts()
            return self._facts

    def runtime(self, env: Mapping[str, str], timeout_s: float = RUNTIME_TIMEOUT_S) -> TorchRuntime:
        """torch.cuda / torch.distributed answers under `env`; one subprocess per distinct env,
        shared by every check that asks (the others wait for it)."""
        key = tuple(sorted(env.items()))
        with self._runtime_lock:
            if key not in self._runtime:
                self._runtime[key] = run_torch_runtime(env, timeout_s)
            return self._runtime[key]


def read_torch_facts() -> TorchFacts:
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        return TorchFacts(installed=False, error=str(exc), platform=sys.platform)
    if spec is None or not spec.submodule_search_locations:
        return TorchFacts(installed=False, error="torch is not installed", platform=sys.platform)
    location = next(iter(spec.submodule_search_locations))
    version_vars = read_version_py(os.path.join(location, "version.py"))
    version = version_vars.get("__version__") or _distribution_version("torch")
    lib_dir = os.path.join(location, "lib")
    cuda_lib = os.path.join(lib_dir, "libtorch_cuda.so")
    has_cuda_lib = os.path.exists(cuda_lib)
    linkage, library = "none", None
    if has_cuda_lib:
        linkage, library = find_torch_libnccl(cuda_lib, os.environ.get("LD_LIBRARY_PATH", ""))
    nccl_version, nccl_error = (None, None)
    if library:
        nccl_version, nccl_error = nccl_version_of(library)
    elif linkage == "static":
        nccl_error = "NCCL is linked into libtorch_cuda.so; its version needs `import torch`"
    package, package_version = _nccl_package()
    return TorchFacts(
        installed=True,
        version=version,
        location=location,
        cuda=version_vars.get("cuda"),
        hip=version_vars.get("hip"),
        cuda_libs=has_cuda_lib,
        platform=sys.platform,
        nccl_linkage=linkage,
        nccl_library=library,
        nccl_version=nccl_version,
        nccl_error=nccl_error,
        nccl_package=package,
        nccl_package_version=package_version,
        nccl_required=_torch_nccl_pin(),
    )


def read_version_py(path: str) -> dict[str, str | None]:
    """The string constants of torch/version.py (`cuda: Optional[str] = '13.0'`), never executed."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, str | None] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and (value.value is None or isinstance(value.value, str))
        ):
            found[target.id] = value.value
    return found


def find_torch_libnccl(libtorch_cuda: str, ld_library_path: str) -> tuple[str, str | None]:
    """("dynamic", path) for the libnccl.so.2 the loader would give libtorch_cuda.so, following
    its DT_RPATH (before LD_LIBRARY_PATH) and DT_RUNPATH (after); ("static", None) when the
    library does not need libnccl.so.2 (NCCL compiled in); ("dynamic", None) when not found."""
    info = read_dynamic_info(libtorch_cuda)
    if info is None:
        return "static", None
    if NCCL_SONAME not in info.needed:
        return "static", None
    origin = os.path.dirname(os.path.realpath(libtorch_cuda))

    def expand(entries: tuple[str, ...]) -> list[str]:
        return [e.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for e in entries]

    env_dirs = [d for d in ld_library_path.split(":") if d]
    search = (expand(info.rpath) if not info.runpath else []) + env_dirs + expand(info.runpath)
    for directory in search:
        candidate = os.path.join(directory, NCCL_SONAME)
        if os.path.exists(candidate):
            return "dynamic", os.path.normpath(candidate)
    return "dynamic", _loader_path(NCCL_SONAME)


def _loader_path(soname: str) -> str | None:
    """Where the system loader (ld.so.cache, default dirs) finds `soname`, by loading it."""
    import ctypes

    try:
        ctypes.CDLL(soname)
    except OSError:
        return None
    return _mapped_path(soname)


def _mapped_path(soname: str) -> str | None:
    stem = soname.split(".so")[0] + ".so"
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").split(" ")[-1]
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        return None
    return None


def nccl_version_of(library: str) -> tuple[str | None, str | None]:
    """ncclGetVersion() of a libnccl file, as "2.30.7", or the error."""
    import ctypes

    try:
        lib = ctypes.CDLL(library)
        code = ctypes.c_int(0)
        status = lib.ncclGetVersion(ctypes.byref(code))
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {library}: {exc}"
    if status != 0:
        return None, f"ncclGetVersion returned error {status}"
    return decode_nccl_version(code.value), None


def decode_nccl_version(code: int) -> str:
    """NCCL's version code: major*10000+minor*100+patch since 2.9, major*1000+minor*100+patch before."""
    if code < 10000:
        major, minor, patch = code // 1000, (code % 1000) // 100, code % 100
    else:
        major, minor, patch = code // 10000, (code % 10000) // 100, code % 100
    return f"{major}.{minor}.{patch}"


def _distribution_version(name: str) -> str | None:
    import importlib.metadata as metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nccl_package() -> tuple[str | None, str | None]:
    for name in NCCL_PACKAGES:
        version = _distribution_version(name)
        if version:
            return name, version
    return None, None


def _torch_nccl_pin() -> str | None:
    """torch's requirement on the NCCL wheel ("nvidia-nccl-cu13==2.30.7"), from its metadata."""
    import importlib.metadata as metadata

    try:
        requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        if line.startswith("nvidia-nccl"):
            return line.split(";")[0].strip()
    return None


_RUNTIME_SCRIPT = """
import json, torch, torch.distributed as dist
out = {"cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
       "nccl_available": dist.is_available() and dist.is_nccl_available()}
try:
    out["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:
    out["nccl_version"] = None
print("DDPDOCTOR-TORCH " + json.dumps(out), flush=True)
"""


def run_torch_runtime(env: Mapping[str, str], timeout_s: float) -> TorchRuntime:
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUNTIME_SCRIPT],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        return TorchRuntime(error=f"cannot start {sys.executable}: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return TorchRuntime(
            error=f"`import torch; torch.cuda.device_count()` did not finish in {timeout_s:g} s",
            elapsed_s=time.monotonic() - start,
        )
    elapsed = time.monotonic() - start
    for line in out.splitlines():
        if line.startswith("DDPDOCTOR-TORCH "):
            data = json.loads(line.split(" ", 1)[1])
            return TorchRuntime(**data, elapsed_s=elapsed)
    last = (err.strip().splitlines() or ["no output"])[-1]
    return TorchRuntime(error=f"torch failed (exit {proc.returncode}): {last}", elapsed_s=elapsed)


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
