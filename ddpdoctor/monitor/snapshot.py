"""Frozen snapshots of a run: the only thing the TUI, the headless text view and the JSON output see.

The monitor (RunState + diagnosis rules) builds one Snapshot per poll. Everything here is immutable
and cheap to compare, so a view can diff the previous snapshot against the next and update only
what changed. `Snapshot.diagnosis_json()` is RUN_DIR/diagnosis.json and `watch --json` (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ddpdoctor.findings import Finding

SCHEMA_VERSION = 1


class RankState(str, Enum):
    STARTING = "starting"  # launched, no hello yet (or hello but not yet training)
    RUNNING = "running"  # making progress
    IN_COLLECTIVE = "in_collective"  # inside a collective, for a normal time so far
    WAITING = "waiting"  # inside a collective longer than usual: waiting for other ranks
    STALLED = "stalled"  # no progress past the hang threshold (or its heartbeat stopped)
    DONE = "done"  # exited with code 0
    FAILED = "failed"  # raised, or exited non-zero
    GONE = "gone"  # its process vanished without an exit event (killed, OOM, a signal)

    @property
    def finished(self) -> bool:
        return self in (RankState.DONE, RankState.FAILED, RankState.GONE)


class Verdict(str, Enum):
    RUNNING = "running"
    HEALTHY = "healthy"
    HANG = "hang"
    MISMATCH = "mismatch"
    CRASH = "crash"

    @property
    def is_problem(self) -> bool:
        return self in (Verdict.HANG, Verdict.MISMATCH, Verdict.CRASH)


@dataclass(frozen=True)
class CollectiveView:
    op: str
    seq: int
    waiting_s: float
    group: str = "default"
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()

    def describe(self) -> str:
        """ "all_reduce #41 of [10] float32", as diagnoses name a collective."""
        text = f"{self.op} #{self.seq}"
        if self.shapes:
            text += " of " + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.shapes)
        if self.dtypes:
            text += " " + "/".join(dict.fromkeys(self.dtypes))
        if self.group != "default":
            text += f" (group {self.group})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "seq": self.seq,
            "waiting_s": round(self.waiting_s, 3),
            "group": self.group,
            "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes),
        }


@dataclass(frozen=True)
class RankView:
    rank: int
    state: RankState
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    phase: str | None = None
    step: int | None = None
    total_steps: int | None = None  # planned steps, for progress bars (None when unknown)
    epoch: int | None = None
    loss: float | None = None
    step_time_s: float | None = None
    data_time_s: float | None = None
    compute_time_s: float | None = None
    comm_wait_s: float | None = None
    samples_per_s: float | None = None
    collective: CollectiveView | None = None
    collectives_done: int = 0
    heartbeat_age_s: float | None = None
    alive: bool | None = None  # None: not on this host, so we cannot tell
    exit_code: int | None = None
    error: str | None = None  # one line: "RuntimeError: boom"
    last_event: str | None = None  # "step 12", "collective_start all_reduce #40", ...
    rss_bytes: int | None = None
    gpu_mem_bytes: int | None = None
    step_times: tuple[float, ...] = ()  # recent step times, oldest first, for sparklines
    waiting_on: tuple[int, ...] = ()  # ranks this one waits for in its collective
    group_seqs: tuple[tuple[str, int], ...] = ()  # (group, last collective seq started) per group
    recent_collectives: tuple[CollectiveView, ...] = ()  # the last few started, oldest first
    traceback: str | None = None  # of the error, when the rank raised
    failed_t: float | None = None  # unix time of its error / non-zero exit / disappearance
    exit_signal: str | None = None  # "SIGKILL", ... when the exit code says a signal ended it

    def seq_in(self, group: str = "default") -> int:
        """The last collective sequence number this rank started in `group` (0: none yet)."""
        for name, seq in self.group_seqs:
            if name == group:
                return seq
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "state": self.state.value,
            "step": self.step,
            "collective": self.collective.to_json() if self.collective else None,
            "local_rank": self.local_rank,
            "phase": self.phase,
            "epoch": self.epoch,
            "loss": self.loss,
            "step_time_s": self.step_time_s,
            "samples_per_s": self.samples_per_s,
            "heartbeat_age_s": None
            if self.heartbeat_age_s is None
            else round(self.heartbeat_age_s, 3),
            "alive": self.alive,
            "exit_code": self.exit_code,
            "error": self.error,
            "last_event": self.last_event,
            "waiting_on": list(self.waiting_on),
        }


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks are identical (after folding library frames)."""

    ranks: tuple[int, ...]
    frames: tuple[str, ...]  # "file:line function", innermost last, library frames folded
    full_frames: tuple[str, ...] = ()  # unfolded, for the detail view
    thread: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "frames": list(self.frames), "thread": self.thread}


@dataclass(frozen=True)
class LogLine:
    source: str  # "rank 1 stderr", "nccl vm.1234", ...
    text: str
    rank: int | None = None
    level: str = "info"  # "error" | "warn" | "info"
    file: str | None = None
    line_no: int | None = None
    finding_id: str | None = None  # set when a log explainer recognised this line


@dataclass(frozen=True)
class RunInfo:
    name: str
    run_dir: str
    world_size: int | None = None
    backend: str | None = None
    hosts: tuple[str, ...] = ()
    started_t: float | None = None
    command: tuple[str, ...] = ()
    nnodes: int | None = None
    total_steps: int | None = None


@dataclass(frozen=True)
class Snapshot:
    run: RunInfo
    taken_t: float  # unix time the snapshot describes
    ranks: tuple[RankView, ...]
    verdict: Verdict = Verdict.RUNNING
    findings: tuple[Finding, ...] = ()
    stacks: tuple[StackGroup, ...] = ()
    detected_after_s: float | None = None  # problem start -> verdict, when a problem was found
    logs: tuple[LogLine, ...] = ()  # the most recent lines, bounded
    stack_status: str | None = None  # "capturing", "captured 12:01:03", "py-spy missing", ...
    culprits: frozenset[int] = field(default_factory=frozenset)
    finished: bool = False  # every rank is done / failed / gone (post-mortem view)

    @property
    def elapsed_s(self) -> float | None:
        if self.run.started_t is None:
            return None
        return max(0.0, self.taken_t - self.run.started_t)

    def diagnosis_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict.value,
            "detected_after_s": None
            if self.detected_after_s is None
            else round(self.detected_after_s, 3),
            "ranks": [r.to_json() for r in self.ranks],
            "findings": [f.to_json() for f in self.findings],
            "stacks": [s.to_json() for s in self.stacks],
            "culprits": sorted(self.culprits),
            "run": {
                "name": self.run.name,
                "run_dir": self.run.run_dir,
                "world_size": self.run.world_size,
                "backend": self.run.backend,
                "hosts": list(self.run.hosts),
            },
            "taken_t": self.taken_t,
            "finished": self.finished,
        }
