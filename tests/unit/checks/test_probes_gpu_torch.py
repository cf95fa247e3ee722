"""The real GPU and torch probes on this machine, their pure helpers, and (marked gpu) a cross-check
of NVML against torch.cuda on a machine with GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddpdoctor.checks.probes.elf_deps import read_dynamic_info
from ddpdoctor.checks.probes.gpu import (
    GpuFacts,
    RealGpuProbe,
    read_infiniband,
    stub_dirs_on_library_path,
)
from ddpdoctor.checks.probes.torch_facts import (
    RealTorchProbe,
    decode_nccl_version,
    find_torch_libnccl,
    read_version_py,
    run_torch_runtime,
)
from tests.conftest import gpu_available
from tests.procs import REPO, clean_env
from tests.unit.recorded_machines import FACTS_DIR, MACHINES, load_machine

_TORCH_DIR = RealTorchProbe().facts().location
TORCH_CUDA_LIB = os.path.join(_TORCH_DIR, "lib", "libtorch_cuda.so") if _TORCH_DIR else None


def test_nvml_missing_is_a_fact_not_an_exception():
    if gpu_available():
        pytest.skip("this machine has a GPU")
    facts = RealGpuProbe().facts()
    assert facts.nvml_error and "NVML" in facts.nvml_error
    assert facts.devices == () and facts.count == 0 and not facts.nvml_ok


def test_a_hung_nvml_is_bounded(monkeypatch):
    import threading

    import ddpdoctor.checks.probes.gpu as gpu_probe

    release = threading.Event()
    monkeypatch.setattr(gpu_probe, "read_gpu_facts", lambda: release.wait(30) or GpuFacts())
    try:
        facts = RealGpuProbe(timeout_s=0.2).facts()
    finally:
        release.set()
    assert facts.nvml_error == "NVML did not answer within 0.2 s"


def test_torch_facts_without_importing_torch():
    # A fresh interpreter: read the facts, then prove torch was never imported.
    code = (
        "import json, sys\n"
        "from ddpdoctor.checks.probes.torch_facts import RealTorchProbe\n"
        "facts = RealTorchProbe().facts()\n"
        "print(json.dumps({'facts': facts.to_json(), 'torch_imported': 'torch' in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=clean_env(),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["torch_imported"] is False
    facts = data["facts"]
    import importlib.metadata as metadata

    assert facts["installed"] is True
    assert facts["version"].split("+")[0] == metadata.version("torch").split("+")[0]


def test_decode_nccl_version():
    assert decode_nccl_version(2804) == "2.8.4"  # before 2.9: major*1000 + minor*100 + patch
    assert decode_nccl_version(21805) == "2.18.5"
    assert decode_nccl_version(23007) == "2.30.7"


def test_version_py_is_parsed_not_run(tmp_path):
    path = tmp_path / "version.py"
    path.write_text(
        "from typing import Optional\n"
        "__version__ = '2.4.0+cu121'\n"
        "cuda: Optional[str] = '12.1'\n"
        "hip: Optional[str] = None\n"
        "raise SystemExit('executing version.py is not allowed')\n"
    )
    found = read_version_py(str(path))
    assert found == {"__version__": "2.4.0+cu121", "cuda": "12.1", "hip": None}
    assert read_version_py(str(tmp_path / "missing.py")) == {}


def test_elf_reader(tmp_path):
    not_elf = tmp_path / "x.so"
    not_elf.write_text("hello")
    assert read_dynamic_info(str(not_elf)) is None
    libc_user = read_dynamic_info("/bin/ls")
    assert libc_user is not None and "libc.so.6" in libc_user.needed


@pytest.mark.skipif(
    not (TORCH_CUDA_LIB and os.path.exists(TORCH_CUDA_LIB)), reason="needs a CUDA build of torch"
)
def test_rpath_wins_over_ld_library_path(tmp_path):
    # libtorch_cuda.so carries DT_RPATH, which the loader searches BEFORE LD_LIBRARY_PATH.
    decoy = tmp_path / "libnccl.so.2"
    decoy.write_text("not a library")
    linkage, path = find_torch_libnccl(TORCH_CUDA_LIB, str(tmp_path))
    assert linkage == "dynamic"
    assert path and path != str(decoy) and path.endswith("libnccl.so.2")


def test_stub_directories_on_the_library_path(tmp_path):
    stubs = tmp_path / "cuda" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_text("")
    other = tmp_path / "lib"
    other.mkdir()
    found = stub_dirs_on_library_path(f"{other}:{stubs}:/nonexistent/stubs")
    assert found == (str(stubs),)


def test_infiniband_from_sysfs(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("Ethernet\n")
    down = tmp_path / "mlx5_1" / "ports" / "1"
    down.mkdir(parents=True)
    (down / "state").write_text("1: DOWN\n")
    (down / "link_layer").write_text("InfiniBand\n")
    devices = read_infiniband(str(tmp_path))
    assert [d.name for d in devices] == ["mlx5_0", "mlx5_1"]
    assert devices[0].active and devices[0].ports[0].link_layer == "Ethernet"
    assert not devices[1].active
    assert read_infiniband(str(tmp_path / "none")) == ()


def test_torch_runtime_is_bounded():
    result = run_torch_runtime(clean_env(), timeout_s=0.05)
    assert result.error and "did not finish in 0.05 s" in result.error


@pytest.mark.parametrize("name", MACHINES)
def test_recorded_facts_round_trip(name):
    machine = load_machine(name)
    raw = json.loads((FACTS_DIR / f"{name}.json").read_text())
    assert machine.gpu.to_json() == raw["gpu"]
    assert machine.torch.to_json() == raw["torch"]
    for device in machine.gpu.devices:
        assert device.memory_used_bytes + device.memory_free_bytes == device.memory_total_bytes
        assert device.uuid.startswith("GPU-")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_nccl_version_read_by_ctypes_matches_torch():
    """A real cross-check: libnccl's ncclGetVersion (no torch) against torch.cuda.nccl.version()."""
    facts = RealTorchProbe().facts()
    if not facts.nccl_built_in:
        pytest.skip("this torch has no NCCL")
    runtime = RealTorchProbe().runtime(clean_env(), timeout_s=90)
    assert runtime.error is None, runtime.error
    assert runtime.nccl_available is True
    assert facts.nccl_version is not None, facts.nccl_error
    assert runtime.nccl_version == facts.nccl_version


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_nvml_and_torch_agree_on_real_gpus():
    gpu = RealGpuProbe().facts()
    assert gpu.nvml_ok and gpu.count > 0 and gpu.driver_version
    code = (
        "import json, torch\n"
        "print(json.dumps([{'name': torch.cuda.get_device_name(i),\n"
        "                   'uuid': str(torch.cuda.get_device_properties(i).uuid),\n"
        "                   'total': torch.cuda.get_device_properties(i).total_memory}\n"
        "                  for i in range(torch.cuda.device_count())]))\n"
    )
    env = clean_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's order
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) == gpu.count
    for device, torch_view in zip(gpu.devices, seen, strict=True):
        assert torch_view["name"] == device.name
        assert device.uuid.endswith(torch_view["uuid"])
        assert torch_view["total"] <= device.memory_total_bytes
    runtime = RealTorchProbe().runtime(env, timeout_s=90)
    assert runtime.cuda_available and runtime.device_count == gpu.count
    assert runtime.nccl_version == RealTorchProbe().facts().nccl_version
    if gpu.libcuda_path:
        assert "/stubs/" not in gpu.libcuda_path


class _FakeNvml:
    """The slice of pynvml the GPU probe calls, answering like a 2-GPU machine where GPU 1 runs
    this very process (so psutil can name it) and MIG queries are not supported on GPU 0."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, pid: int) -> None:
        from types import SimpleNamespace as NS

        self._ns, self._pid, self.shut_down = NS, pid, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self):
        return "550.54.14"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA GeForce RTX 3090"  # old pynvml returns bytes

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetPciInfo(self, h):
        return self._ns(busId=f"00000000:0{h[1]}:00.0")

    def nvmlDeviceGetMemoryInfo(self, h):
        used = 2 * 2**30 if h[1] == 1 else 2**20
        return self._ns(total=24 * 2**30, used=used, free=24 * 2**30 - used)

    def nvmlDeviceGetComputeMode(self, h):
        return 3 if h[1] == 1 else 0

    def nvmlDeviceGetMigMode(self, h):
        raise self.NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self._ns(pid=self._pid, usedGpuMemory=2 * 2**30)] if h[1] == 1 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [self._ns(pid=self._pid, usedGpuMemory=None)] if h[1] == 1 else []


def test_nvml_answers_become_frozen_facts(monkeypatch):
    fake = _FakeNvml(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    facts = RealGpuProbe().facts()
    assert fake.shut_down
    assert facts.nvml_ok and facts.driver_version == "550.54.14" and facts.cuda_driver == "12.4"
    assert [d.name for d in facts.devices] == ["NVIDIA GeForce RTX 3090"] * 2
    gpu0, gpu1 = facts.devices
    assert gpu0.compute_mode == "Default" and gpu0.mig_enabled is None and gpu0.processes == ()
    assert gpu1.compute_mode == "Exclusive_Process" and gpu1.pci_bus_id == "00000000:01:00.0"
    (proc,) = gpu1.processes  # compute and graphics lists name the same pid once
    assert proc.pid == os.getpid() and proc.used_memory_bytes == 2 * 2**30
    import psutil

    assert proc.command == " ".join(psutil.Process().cmdline())[:200]
    assert proc.user == psutil.Process().username()
    assert GpuFacts.from_json(facts.to_json()) == facts
