"""System checks with injected facts: /dev/shm, limits, CPUs, memory, py-spy and ptrace."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from ddpdoctor.checks import system
from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.probes.fs import DiskSpace
from ddpdoctor.checks.probes.system import (
    CpuInfo,
    Limits,
    MemoryInfo,
    PySpyInfo,
    ShmSegment,
    ptrace_from_text,
)

GiB, MiB = 1 << 30, 1 << 20

# /proc/self/status excerpts: root on a bare host (all capabilities), root in a default Docker
# container (no CAP_SYS_PTRACE: bit 19 of 0xa80425fb is clear), and a plain user.
STATUS_ROOT_HOST = "Name:\tpython\nUid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\nSeccomp:\t0\n"
STATUS_ROOT_DOCKER = "Name:\tpython\nUid:\t0\t0\t0\t0\nCapEff:\t00000000a80425fb\nSeccomp:\t2\n"
STATUS_USER = "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n"


@dataclass
class FakeFs:
    space: DiskSpace | None = field(
        default_factory=lambda: DiskSpace("/dev/shm", 32 * GiB, 30 * GiB)
    )

    def disk_space(self, path):
        return self.space


@dataclass
class FakeSystem:
    lim: Limits = field(default_factory=lambda: Limits(65536, 65536, None, None))
    ib: tuple[str, ...] = ()
    cpu: CpuInfo = field(default_factory=lambda: CpuInfo(64, 64))
    mem: MemoryInfo = field(default_factory=lambda: MemoryInfo(256 * GiB, 200 * GiB))
    segments: tuple[ShmSegment, ...] = ()
    spy: PySpyInfo = field(default_factory=lambda: PySpyInfo("/usr/bin/py-spy", "0.4.3"))
    status_text: str = STATUS_ROOT_HOST
    yama: str | None = None
    euid: int = 0
    path_seen: list[str | None] = field(default_factory=list)

    def limits(self):
        return self.lim

    def infiniband_devices(self):
        return self.ib

    def cpus(self):
        return self.cpu

    def memory(self):
        return self.mem

    def shm_segments(self, directory):
        return self.segments

    def pyspy(self, path_env):
        self.path_seen.append(path_env)
        return self.spy

    def ptrace(self):
        return ptrace_from_text(self.status_text, self.yama, self.euid)


class FakeGpu:
    def __init__(self, count: int = 0) -> None:
        self.count = count

    def facts(self):
        return SimpleNamespace(count=self.count)


def ctx(env=None, *, fs=None, sysp=None, gpus=0, **options) -> CheckContext:
    return CheckContext(
        env=env or {},
        options=DoctorOptions(smoke=False, **options),
        probes=Probes(fs=fs or FakeFs(), system=sysp or FakeSystem(), gpu=FakeGpu(gpus)),
    )


# --- planned ranks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "mask", "visible"),
    [(4, None, 4), (4, "0,1", 2), (4, "", 0), (4, "-1", 0), (4, "0,-1,2", 1), (2, "0,1,2,3", 2)],
)
def test_visible_devices(count, mask, visible):
    assert system.visible_devices(count, mask) == visible


def test_planned_local_ranks_prefers_the_plan_then_gpus_then_two():
    assert system.planned_local_ranks(ctx(nproc=3)) == (3, "planned")
    assert system.planned_local_ranks(ctx({"LOCAL_WORLD_SIZE": "5"})) == (5, "planned")
    assert system.planned_local_ranks(ctx(gpus=8))[0] == 8
    assert system.planned_local_ranks(ctx({"CUDA_VISIBLE_DEVICES": "0,1"}, gpus=8))[0] == 2
    assert system.planned_local_ranks(ctx()) == (2, "assumed; pass --nproc")


def test_a_broken_gpu_probe_counts_as_no_gpu():
    class BrokenGpu:
        def facts(self):
            raise RuntimeError("NVML exploded")

    c = CheckContext(env={}, options=DoctorOptions(smoke=False), probes=Probes(gpu=BrokenGpu()))
    assert system.planned_local_ranks(c) == (2, "assumed; pass --nproc")


# --- /dev/shm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "free", "nproc", "status"),
    [
        (64 * MiB, 64 * MiB, 2, Status.WARN),  # Docker's default
        (64 * MiB, 64 * MiB, 1, Status.PASS),
        (2 * GiB, 900 * MiB, 4, Status.WARN),
        (2 * GiB, 1100 * MiB, 4, Status.PASS),
        (1 * GiB, 10 * MiB, 1, Status.WARN),  # full, even for one rank
    ],
)
def test_shm_size_thresholds(total, free, nproc, status):
    result = system.shm(ctx(fs=FakeFs(DiskSpace("/dev/shm", total, free)), nproc=nproc))
    assert result.status is status
    if status is Status.WARN:
        assert "--shm-size" in result.fix and "No space left on device" in result.summary


def test_docker_default_shm_is_named():
    result = system.shm(ctx(fs=FakeFs(DiskSpace("/dev/shm", 64 * MiB, 60 * MiB)), nproc=2))
    assert "Docker's default" in result.summary and "60.0 MiB free of 64.0 MiB" in result.summary


def test_stale_segments_are_listed_with_the_rm_command():
    segments = (
        ShmSegment("nccl-AbC123", 9637888, None, in_use=False),
        ShmSegment("nccl-Live99", 9637888, None, in_use=True),
        ShmSegment("torch_4242_1_0", 4096, 4242, in_use=False),
    )
    result = system.shm(ctx(sysp=FakeSystem(segments=segments), nproc=2))
    assert result.status is Status.WARN
    assert "2 stale segments" in result.summary and "nccl-Live99" not in result.fix
    assert "rm -f /dev/shm/nccl-AbC123 /dev/shm/torch_4242_1_0" in result.fix
    assert result.facts["stale_segments"] == ["nccl-AbC123", "torch_4242_1_0"]


def test_missing_dev_shm_warns():
    result = system.shm(ctx(fs=FakeFs(None)))
    assert result.status is Status.WARN and "does not exist" in result.summary


def test_roomy_shm_passes():
    result = system.shm(ctx(nproc=8))
    assert result.status is Status.PASS and "for 8 local ranks" in result.summary


# --- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soft", "hard", "workers", "status", "needle"),
    [
        (1024, 1048576, 2, Status.WARN, "ulimit -n 65536"),
        (1024, 4096, 4, Status.WARN, "raise the hard limit (4096)"),
        (4096, 4096, 2, Status.PASS, ""),
        (4096, 4096, 8, Status.WARN, "/etc/security/limits.conf"),
        (None, None, 16, Status.PASS, ""),
    ],
)
def test_open_files_limit(soft, hard, workers, status, needle):
    sysp = FakeSystem(lim=Limits(soft, hard, None, None))
    result = system.limits(ctx(sysp=sysp, nproc=2, workers=workers))
    assert result.status is status, result.summary
    assert needle.lower() in (result.fix or "").lower()
    assert result.facts["nofile_needed"] == 1024 + 512 * workers + 4 * 2


@pytest.mark.parametrize(
    ("memlock", "ib", "status"),
    [
        (8 * MiB, ("mlx5_0",), Status.WARN),  # fixture 15: ulimit -l 8192 with IB
        (None, ("mlx5_0",), Status.PASS),
        (8 * MiB, (), Status.PASS),  # this machine: 8 MiB, no IB
    ],
)
def test_memlock_matters_only_with_infiniband(memlock, ib, status):
    sysp = FakeSystem(lim=Limits(65536, 65536, memlock, memlock), ib=ib)
    result = system.limits(ctx(sysp=sysp))
    assert result.status is status
    if status is Status.WARN:
        assert "mlx5_0" in result.summary and "memlock unlimited" in result.fix
        assert "--ulimit memlock=-1" in result.fix
    else:
        assert "memlock" in result.summary


# --- CPU and memory -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "quota", "nproc", "workers", "status"),
    [
        (64, None, 8, 4, Status.PASS),  # 40 busy processes on 64 cores
        (16, None, 8, 4, Status.WARN),  # 40 on 16
        (64, 8.0, 8, 2, Status.WARN),  # docker --cpus=8
        (2, None, 2, 0, Status.PASS),
    ],
)
def test_cpu_oversubscription(cores, quota, nproc, workers, status):
    sysp = FakeSystem(cpu=CpuInfo(cores, cores, quota))
    result = system.cpu(ctx(sysp=sysp, nproc=nproc, workers=workers))
    assert result.status is status, result.summary
    if status is Status.WARN:
        assert "OMP_NUM_THREADS=" in result.fix and "num_workers=" in result.fix


def test_omp_threads_times_ranks_over_cores_warns():
    result = system.cpu(ctx({"OMP_NUM_THREADS": "16"}, nproc=8, workers=0))
    assert result.status is Status.WARN and "OMP_NUM_THREADS=8" in result.fix


@pytest.mark.parametrize(
    ("total", "available", "nproc", "status"),
    [(256 * GiB, 200 * GiB, 8, Status.PASS), (16 * GiB, 3 * GiB, 4, Status.WARN)],
)
def test_memory_headroom(total, available, nproc, status):
    sysp = FakeSystem(mem=MemoryInfo(total, available))
    result = system.memory(ctx(sysp=sysp, nproc=nproc))
    assert result.status is status
    if status is Status.WARN:
        assert "exitcode -9" in result.summary


# --- py-spy and ptrace ----------------------------------------------------------------------------


def test_pyspy_missing_warns_with_pip_install():
    sysp = FakeSystem(spy=PySpyInfo(None, error="not found"))
    result = system.pyspy(ctx({"PATH": "/usr/bin"}, sysp=sysp))
    assert result.status is Status.WARN
    assert result.fix == "pip install py-spy" and sysp.path_seen == ["/usr/bin"]


def test_pyspy_that_does_not_run_warns():
    sysp = FakeSystem(spy=PySpyInfo("/x/py-spy", error="exec format error"))
    assert system.pyspy(ctx(sysp=sysp)).status is Status.WARN


@pytest.mark.parametrize(
    ("status_text", "yama", "euid", "allowed"),
    [
        (STATUS_ROOT_HOST, None, 0, True),  # this machine: root, every capability, no Yama
        (STATUS_ROOT_HOST, "3", 0, False),
        (STATUS_ROOT_DOCKER, "1", 0, False),  # Docker without --cap-add SYS_PTRACE, Ubuntu host
        (STATUS_ROOT_DOCKER, "0", 0, True),
        (STATUS_USER, "1", 1000, False),
        (STATUS_USER, "0", 1000, True),
        (STATUS_USER, None, 1000, True),
    ],
)
def test_ptrace_permission_from_recorded_status(status_text, yama, euid, allowed):
    sysp = FakeSystem(status_text=status_text, yama=yama, euid=euid)
    result = system.pyspy(ctx(sysp=sysp))
    assert result.facts["ptrace_allowed"] is allowed
    if allowed:
        assert result.status is Status.PASS and "0.4.3" in result.summary
    else:
        assert result.status is Status.WARN
        assert "--cap-add SYS_PTRACE" in result.fix and "ptrace_scope" in result.fix


def test_ptrace_from_text_parses_fields():
    info = ptrace_from_text(STATUS_ROOT_DOCKER, "1\n", 0)
    assert (info.yama_scope, info.cap_sys_ptrace, info.is_root, info.seccomp) == (1, False, True, 2)
    assert ptrace_from_text(STATUS_ROOT_HOST, None, 0).cap_sys_ptrace is True
    assert ptrace_from_text("garbage", "x", 5).yama_scope is None


def test_cpu_with_workers_unknown_judges_ranks_and_says_what_fits():
    sysp = FakeSystem(cpu=CpuInfo(2, 2))
    result = system.cpu(ctx(sysp=sysp, nproc=2))
    assert result.status is Status.PASS
    assert "no core to spare for DataLoader workers (num_workers=0 fits)" in result.summary
    crowded = system.cpu(ctx(sysp=FakeSystem(cpu=CpuInfo(2, 2)), nproc=4))
    assert crowded.status is Status.WARN, "more ranks than cores warns whatever the workers"


def test_a_pods_default_shm_is_flagged_with_what_needs_it_and_the_pod_spec_fix():
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    result = system.shm(ctx(pod, fs=FakeFs(DiskSpace("/dev/shm", 64 * MiB, 64 * MiB)), nproc=2))
    assert result.status is Status.WARN
    assert "(a container's default)" in result.summary
    assert "emptyDir" in result.fix and "medium: Memory" in result.fix
    assert any("NCCL_BUFFSIZE" in d and "DataLoader worker" in d for d in result.details)
