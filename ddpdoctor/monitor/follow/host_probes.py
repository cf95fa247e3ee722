"""Facts about a rank's process that only its own host can see: its children's CPU (DataLoader
workers) and its GPU utilization (NVML). The monitor asks only about the ranks others wait on, at
most once a second each, so a poll over 1024 ranks stays cheap; the heartbeats carry the rest
(ddpdoctor.monitor.model.progress), which works for ranks on every node.

GPU facts go through the small GpuProbe interface: NvmlProbe on a machine with NVIDIA's driver,
RecordedGpuProbe (recorded values) in tests, NoGpu where there is none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from ddpdoctor.launchers.proc_tree import descendants

if TYPE_CHECKING:
    from ddpdoctor.monitor.model.snapshot import Snapshot
    from ddpdoctor.monitor.model.state import RunState

PROBE_EVERY_S = 1.0
MAX_PROBED = 8  # ranks probed per poll: the ranks waited on are few (rank 0, a straggler)


class GpuProbe(Protocol):
    def utilization(self, pids: Collection[int]) -> dict[int, float]:
        """pid -> recent GPU (SM) utilization in percent, for the pids the GPUs know."""
        ...


class NoGpu:
    def utilization(self, pids: Collection[int]) -> dict[int, float]:
        return {}


class RecordedGpuProbe:
    """Recorded utilizations (tests; replays of a GPU machine's values)."""

    def __init__(self, values: Mapping[int, float]) -> None:
        self.values = dict(values)
        self.calls = 0

    def utilization(self, pids: Collection[int]) -> dict[int, float]:
        self.calls += 1
        return {pid: self.values[pid] for pid in pids if pid in self.values}


class NvmlProbe:
    """Per-process SM utilization from NVML (nvmlDeviceGetProcessUtilization). Without pynvml or
    a driver it turns itself off at the first call and answers {} from then on."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] | None = None
        self._last_seen: dict[int, int] = {}  # device index -> latest sample timestamp

    def _open(self) -> list[Any]:
        if self._handles is None:
            self._handles = []
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                count = pynvml.nvmlDeviceGetCount()
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            except Exception:  # noqa: BLE001 - no pynvml, no driver, no GPU: no GPU facts
                self._handles = []
        return self._handles

    def utilization(self, pids: Collection[int]) -> dict[int, float]:
        wanted = set(pids)
        out: dict[int, float] = {}
        for index, handle in enumerate(self._open()):
            try:
                samples = self._nvml.nvmlDeviceGetProcessUtilization(
                    handle, self._last_seen.get(index, 0)
                )
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_FOUND: no samples since then
                continue
            for sample in samples:
                stamp = int(getattr(sample, "timeStamp", 0))
                self._last_seen[index] = max(self._last_seen.get(index, 0), stamp)
                pid = int(getattr(sample, "pid", -1))
                if pid in wanted:
                    out[pid] = max(out.get(pid, 0.0), float(getattr(sample, "smUtil", 0)))
        return out


class ChildCpu:
    """CPU percent of a process's children (DataLoader workers and their like) between two
    looks; only children seen both times count, so workers that come and go do not jump."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, dict[int, float]]] = {}  # pid -> (t, child -> cpu s)

    def sample(self, pid: int, t: float) -> float | None:
        if not psutil.pid_exists(pid):
            self._seen.pop(pid, None)
            return None
        now: dict[int, float] = {}
        for child in descendants(pid):
            try:
                times = psutil.Process(child).cpu_times()
            except (psutil.Error, OSError):
                continue
            now[child] = times.user + times.system
        previous = self._seen.get(pid)
        self._seen[pid] = (t, now)
        if previous is None or t <= previous[0]:
            return None
        used = sum(max(0.0, cpu - previous[1][c]) for c, cpu in now.items() if c in previous[1])
        return 100.0 * used / (t - previous[0])


class HostProbes:
    """Children's CPU and GPU utilization of the local ranks that others waited on at the last
    poll: what tells a rank whose workers or GPU do the work from a blocked one."""

    def __init__(self, gpu_probe: GpuProbe) -> None:
        self.gpu_probe = gpu_probe
        self.child_cpu = ChildCpu()
        self._probed: dict[int, float] = {}  # rank -> when its host facts were last sampled

    def probe(self, state: RunState, last: Snapshot | None, now: float) -> None:
        """`last`: the monitor's previous snapshot (None at its first poll)."""
        if last is None:
            return
        targets: set[int] = set()
        for wait in last.waits:
            targets.update(wait.on)
        for view in last.ranks:
            targets.update(view.waiting_on)
        pids: dict[int, int] = {}
        for rank in sorted(targets):
            tracker = state.ranks.get(rank)
            if tracker is None or tracker.pid is None or state.alive.get(rank) is not True:
                continue  # not on this host (the heartbeats speak for it), or not alive
            if 0 <= now - self._probed.get(rank, float("-inf")) < PROBE_EVERY_S:
                continue
            pids[rank] = tracker.pid
            if len(pids) >= MAX_PROBED:
                break
        if not pids:
            return
        try:
            gpu = self.gpu_probe.utilization(list(pids.values()))
        except Exception:  # noqa: BLE001 - a GPU fact is a bonus, never a reason to fail
            gpu = {}
        for rank, pid in pids.items():
            self._probed[rank] = now
            progress = state.ranks[rank].progress
            progress.set_children(now, self.child_cpu.sample(pid, now))
            progress.set_gpu(now, gpu.get(pid))
