"""Is a rank making progress? Busy, blocked or waiting on its GPU, from what its heartbeats say.

Every heartbeat carries cumulative facts of the rank's process (ddpdoctor/runtime/progress_probe.py):
its CPU seconds, the bytes it read and wrote, and the main thread's innermost frame and
line. Two successive heartbeats make an *interval*; an interval is active when the CPU advanced by
at least BUSY_CPU of a core (counting the time its main thread waited for a CPU it was ready to
use: on an overloaded machine a busy rank gets a fraction of a core), I/O flowed at BUSY_IO_BPS or more, or the main thread moved (another
frame: file, line, function). Where the monitor can see the process (same host) it adds
the CPU of the rank's children (DataLoader workers doing the work while the main thread waits on
their queue) and, on GPUs, the process's GPU utilization (ddpdoctor/monitor/follow/host_probes.py).

    busy      the latest interval was active, or it idled for fewer than BLOCKED_INTERVALS
              in a row after activity (a pause between two chunks of a download is not a hang)
    gpu_wait  the main thread idles while its GPU works
    blocked   BLOCKED_INTERVALS idle intervals in a row (three heartbeats with no CPU advance,
              no I/O and the very same frame): asleep, on a lock, a queue, a quiet socket

With fewer samples the state is unknown (None): the rules then fall back to what they did before
this model, so an old runtime, or a rank that just started, is judged as it always was.

Heartbeats are the rank's word; where the watcher sees the process itself (its own host) it also
looks at the process's CPU (HostProbes, for the ranks others wait on), and that look wins: a
process the watcher sees using CPU is busy whatever its heartbeats say. Once a rank's heartbeats
are disputed (numbered out of order: another stream writes its file, own_lines.own_beat) they
cannot make it blocked at all; only the watcher's own looks can, two idle in a row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from ddpdoctor.monitor.model.snapshot import Activity
from ddpdoctor.protocol.verdicts import ActivityState

BUSY_CPU = 0.2  # of one core: a blocked process (its threads asleep) stays far below
BUSY_IO_BPS = 256 * 1024  # the heartbeats' own writes are ~1 KB/s
GPU_BUSY_PCT = 5.0
BLOCKED_INTERVALS = 2
CPU_WINDOW = 3  # intervals the CPU rate is averaged over
MAX_SAMPLES = 16
CHILD_WINDOW_S = 3.0  # children's CPU samples older than this say nothing about now


@dataclass(frozen=True)
class ProgressSample:
    """One heartbeat's progress facts (cumulative values; None where the rank could not tell)."""

    t: float
    cpu_s: float | None
    io_bytes: int | None = None
    frame: str | None = None  # innermost frame of the main thread
    where: str | None = None  # innermost frame in the user's own code
    runq_s: float | None = None  # the main thread's run-queue wait (ready, no CPU free)
    child_cpu_s: float | None = None  # its live children's CPU (DataLoader workers)


class Judgement(NamedTuple):
    """A rank's activity apart from collectives (the view adds those, and the age). (A named
    tuple: a watcher of 1000s of ranks makes one per rank of another node a second.)"""

    state: ActivityState
    since_t: float
    cpu_pct: float | None
    where: str | None
    frame: str | None
    child_cpu_pct: float | None = None
    gpu_util_pct: float | None = None


def interval_active(a: ProgressSample, b: ProgressSample) -> bool:
    dt = b.t - a.t
    if dt <= 0:
        return False
    runnable = 0.0
    if a.cpu_s is not None and b.cpu_s is not None:
        runnable = b.cpu_s - a.cpu_s
    if a.runq_s is not None and b.runq_s is not None:
        runnable += b.runq_s - a.runq_s
    if runnable >= BUSY_CPU * dt:
        return True
    if a.child_cpu_s is not None and b.child_cpu_s is not None:
        runnable = b.child_cpu_s - a.child_cpu_s  # its workers do the work
        if runnable >= BUSY_CPU * dt:
            return True
    io = (b.io_bytes - a.io_bytes) if a.io_bytes is not None and b.io_bytes is not None else 0
    if io >= BUSY_IO_BPS * dt:
        return True
    return a.frame != b.frame


class ProgressTrack:
    """The recent progress samples of one rank and what they add up to (owned by its tracker)."""

    def __init__(self) -> None:
        self.samples: deque[ProgressSample] = deque(maxlen=MAX_SAMPLES)
        self.child_cpu_pct: float | None = None  # set by the monitor for local ranks
        self.child_t: float | None = None
        self.gpu_util_pct: float | None = None
        self.gpu_t: float | None = None
        # The watcher's own looks at the process's CPU (same host): the latest percent, when,
        # and since when the looks have seen it idle (None: the latest was not idle)
        self.own_cpu_pct: float | None = None
        self.own_t: float | None = None
        self.own_idle_since: float | None = None
        self.own_idle_looks = 0
        self.disputed = False  # its heartbeats are not all its process's (own_lines.own_beat)
        self._judged: Judgement | None = None
        self._dirty = False
        self._adopted_reports = False

    @property
    def reports(self) -> bool:
        """Whether the rank's heartbeats carry progress facts (cpu_s)."""
        return bool(self.samples) or self._adopted_reports

    def adopt(self, judged: Judgement | None, reports: bool) -> None:
        """Take the judgement its own node made of a rank of another node (its row,
        ddpdoctor.monitor.follow.rank_rows), from samples this watcher never saw."""
        self._judged, self._dirty, self._adopted_reports = judged, False, reports

    def add(self, sample: ProgressSample) -> None:
        if sample.cpu_s is None:
            return  # a runtime that does not report progress: the rank stays unknown
        if self.samples and sample.t <= self.samples[-1].t:
            return
        self.samples.append(sample)
        self._dirty = True

    def set_children(self, t: float, cpu_pct: float | None) -> None:
        self.child_cpu_pct, self.child_t = cpu_pct, t
        self._dirty = True

    def set_own(self, t: float, cpu_pct: float | None, since: float | None) -> None:
        """The watcher's own look at the process's CPU between `since` and `t`."""
        self.own_cpu_pct, self.own_t = cpu_pct, t
        if cpu_pct is None or cpu_pct >= 100 * BUSY_CPU:
            self.own_idle_since, self.own_idle_looks = None, 0
        else:
            self.own_idle_looks += 1
            if self.own_idle_since is None:
                self.own_idle_since = since if since is not None else t
        self._dirty = True

    def set_gpu(self, t: float, util_pct: float | None) -> None:
        self.gpu_util_pct, self.gpu_t = util_pct, t
        self._dirty = True

    def clear(self) -> None:
        self.samples.clear()
        self._judged = None
        self._dirty = False
        self._adopted_reports = False

    def judge(self) -> Judgement | None:
        if self._dirty:
            judged = judge(
                list(self.samples),
                child_cpu_pct=self._fresh(self.child_cpu_pct, self.child_t),
                gpu_util_pct=self._fresh(self.gpu_util_pct, self.gpu_t),
            )
            self._judged = self._as_seen(judged)
            self._dirty = False
        return self._judged

    def _as_seen(self, judged: Judgement | None) -> Judgement | None:
        """The heartbeats' judgement, checked against the watcher's own looks at the process."""
        own = self._fresh(self.own_cpu_pct, self.own_t)
        if own is not None and own >= 100 * BUSY_CPU and self.own_t is not None:
            if judged is None or judged.state is ActivityState.BLOCKED:
                since = self.own_t if judged is None else judged.since_t
                return _seen(judged, ActivityState.BUSY, since, own)
            return judged
        if not self.disputed or judged is None or judged.state is not ActivityState.BLOCKED:
            return judged
        # disputed heartbeats say blocked: only two idle looks of the watcher's own can
        if own is not None and self.own_idle_looks >= BLOCKED_INTERVALS:
            return _seen(judged, ActivityState.BLOCKED, self.own_idle_since or judged.since_t, own)
        return None

    def runq_share(self) -> float | None:
        """The share of the recent wall time (the last CPU_WINDOW intervals: the steps the
        straggler rule's medians cover, not the start, when importing torch on a busy host
        queues for seconds) its main thread was ready to run but waited for a CPU (its
        heartbeats' run-queue seconds): high on a host with more runnable threads than cores.
        None without two such heartbeats, or when they are disputed."""
        if self.disputed or len(self.samples) < 2:
            return None
        first, last = self.samples[-min(len(self.samples), CPU_WINDOW + 1)], self.samples[-1]
        if first.runq_s is None or last.runq_s is None or last.t - first.t <= 0:
            return None
        return max(0.0, min(1.0, (last.runq_s - first.runq_s) / (last.t - first.t)))

    def _fresh(self, value: float | None, t: float | None) -> float | None:
        if value is None or t is None or not self.samples:
            return None
        return value if self.samples[-1].t - t <= CHILD_WINDOW_S else None


def judge(
    samples: list[ProgressSample],
    *,
    child_cpu_pct: float | None = None,
    gpu_util_pct: float | None = None,
) -> Judgement | None:
    """What the samples (oldest first) say the rank is doing now; None when they cannot tell."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    active = [interval_active(a, b) for a, b in pairwise(samples)]
    if child_cpu_pct is None:
        child_cpu_pct = _child_pct(samples)
    cpu_pct = _cpu_pct(samples)
    idle_run = 0
    for flag in reversed(active):
        if flag:
            break
        idle_run += 1
    children_busy = child_cpu_pct is not None and child_cpu_pct >= 100 * BUSY_CPU
    gpu_busy = gpu_util_pct is not None and gpu_util_pct >= GPU_BUSY_PCT

    def judged(state: ActivityState, since: float) -> Judgement:
        return Judgement(
            state,
            since,
            cpu_pct=cpu_pct,
            where=last.where,
            frame=last.frame,
            child_cpu_pct=child_cpu_pct,
            gpu_util_pct=gpu_util_pct,
        )

    if idle_run < BLOCKED_INTERVALS and any(active):
        return judged(ActivityState.BUSY, _busy_since(samples, active))
    if children_busy:
        return judged(ActivityState.BUSY, samples[-1 - idle_run].t)
    if gpu_busy:
        return judged(ActivityState.GPU_WAIT, samples[-1 - idle_run].t)
    if idle_run >= BLOCKED_INTERVALS:
        return judged(ActivityState.BLOCKED, samples[-1 - idle_run].t)
    return None


def _seen(judged: Judgement | None, state: ActivityState, since: float, cpu: float) -> Judgement:
    if judged is None:
        return Judgement(state, since, cpu_pct=cpu, where=None, frame=None)
    return judged._replace(state=state, since_t=since, cpu_pct=cpu)


def _cpu_pct(samples: list[ProgressSample]) -> float | None:
    last = samples[-1]
    first = samples[max(0, len(samples) - 1 - CPU_WINDOW)]
    dt = last.t - first.t
    if dt <= 0 or last.cpu_s is None or first.cpu_s is None:
        return None
    return max(0.0, 100.0 * (last.cpu_s - first.cpu_s) / dt)


def _child_pct(samples: list[ProgressSample]) -> float | None:
    last = samples[-1]
    first = samples[max(0, len(samples) - 1 - CPU_WINDOW)]
    dt = last.t - first.t
    if dt <= 0 or last.child_cpu_s is None or first.child_cpu_s is None:
        return None
    return max(0.0, 100.0 * (last.child_cpu_s - first.child_cpu_s) / dt)


def _busy_since(samples: list[ProgressSample], active: list[bool]) -> float:
    """Start of the current busy spell: back to the last run of BLOCKED_INTERVALS idle ones."""
    start = 0
    idle = 0
    for i in range(len(active) - 1, -1, -1):
        if active[i]:
            idle = 0
            start = i
        else:
            idle += 1
            if idle >= BLOCKED_INTERVALS:
                break
    return samples[start].t


def activity(
    judgement: Judgement | None,
    *,
    now: float,
    in_collective_since: float | None,
    in_collective: bool,
) -> Activity | None:
    """The rank's Activity for a snapshot taken at `now`."""
    if in_collective:
        since = in_collective_since if in_collective_since is not None else now
        return Activity(
            ActivityState.IN_COLLECTIVE,
            judgement.cpu_pct if judgement else None,
            judgement.where if judgement else None,
            max(0.0, now - since),
        )
    if judgement is None:
        return None
    return Activity(
        judgement.state,
        judgement.cpu_pct,
        judgement.where or judgement.frame,
        max(0.0, now - judgement.since_t),
        frame=judgement.frame,
        child_cpu_pct=judgement.child_cpu_pct,
        gpu_util_pct=judgement.gpu_util_pct,
    )
