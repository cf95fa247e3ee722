"""Facts about a rank's process that only its own host can see: its own CPU and its children's
(DataLoader workers), looked at by the watcher itself, and its GPU utilization (NVML). The monitor asks only about the ranks others wait on, at
most once a second each, so a poll over 1024 ranks stays cheap; the heartbeats carry the rest
(ddpdoctor.monitor.model.progress), which works for ranks on every node.

GPU facts go through the small GpuProbe interface: NvmlProbe on a machine with NVIDIA's driver,
RecordedGpuProbe (recorded values) in tests, NoGpu where there is none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import psutil

from ddpdoctor.launchers.proc_tree import descendants

if TYPE_CHECKING:
    from ddpdoctor.monitor.model.snapshot import Snapshot
    from ddpdoctor.monitor.model.state import RunState

PROBE_EVERY_S = 1.0
MIN_LOOK_S = 0.5  # real seconds between two looks at a process's CPU for a rate
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


class CpuLook(NamedTuple):
    """One look at a process's CPU since the previous look (None: no previous look)."""

    own_pct: float | None  # the process itself, every thread (with its main thread's CPU wait)
    child_pct: float | None  # its children seen at both looks (DataLoader workers)
    since: float | None  # when the previous look was


class CpuLooks:
    """CPU percent of a process, and of its children, between two looks: the watcher's own
    observation, which a rank's heartbeats (its word) cannot change. Only children seen both
    times count, so workers that come and go do not jump. Rates are over the real time between
    the looks (`elapsed`, monotonic), at least MIN_LOOK_S of it: CPU time moves in ticks, and
    a look a few milliseconds after the last would say 0 % or 200 %. `t` (the monitor's clock)
    only says when each look was."""

    def __init__(self, elapsed: Callable[[], float] = time.monotonic) -> None:
        # pid -> (t, real time, its own cpu s, child -> cpu s) of the look rates are taken from
        self._seen: dict[int, tuple[float, float, float | None, dict[int, float]]] = {}
        self._elapsed = elapsed

    def sample(self, pid: int, t: float) -> CpuLook:
        real = self._elapsed()
        previous = self._seen.get(pid)
        if previous is not None and 0 <= real - previous[1] < MIN_LOOK_S:
            return CpuLook(None, None, None)  # too soon to tell: the next look will
        try:
            times = psutil.Process(pid).cpu_times()
            # the CPU it used and the time its main thread was ready but had no CPU: on an
            # overloaded machine a busy process gets a fraction of a core (progress.py too)
            own: float | None = times.user + times.system + (runq_seconds(pid) or 0.0)
        except (psutil.Error, OSError):
            self._seen.pop(pid, None)
            return CpuLook(None, None, None)
        now: dict[int, float] = {}
        for child in descendants(pid):
            try:
                times = psutil.Process(child).cpu_times()
            except (psutil.Error, OSError):
                continue
            now[child] = times.user + times.system
        self._seen[pid] = (t, real, own, now)
        if previous is None or real <= previous[1]:
            return CpuLook(None, None, None)
        dt = real - previous[1]
        used = sum(max(0.0, cpu - previous[3][c]) for c, cpu in now.items() if c in previous[3])
        own_pct = None
        if own is not None and previous[2] is not None:
            own_pct = 100.0 * max(0.0, own - previous[2]) / dt
        return CpuLook(own_pct, 100.0 * used / dt, previous[0])


def runq_seconds(pid: int) -> float | None:
    """Run-queue wait of a process's main thread (/proc/<pid>/schedstat), None off Linux."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read(256).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class HostProbes:
    """The CPU (its own and its children's) and GPU utilization of the local ranks that others
    waited on at the last poll: what tells a rank whose workers or GPU do the work from a
    blocked one, and a busy process from heartbeats that say otherwise."""

    def __init__(self, gpu_probe: GpuProbe) -> None:
        self.gpu_probe = gpu_probe
        self.cpu = CpuLooks()
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
            look = self.cpu.sample(pid, now)
            progress.set_children(now, look.child_pct)
            progress.set_own(now, look.own_pct, look.since)
            progress.set_gpu(now, gpu.get(pid))
