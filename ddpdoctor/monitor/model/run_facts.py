"""What a snapshot holds besides its ranks' views: the run as launched (RunInfo), the thresholds
in force, log lines, and the preflight's script-checkup notes a diagnosis cites. Frozen, like
every part of a Snapshot (ddpdoctor.monitor.model.snapshot, which re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # run.json's: "torchrun" (ddpdoctor's own) or "command" (the user's launch command)
    launch_mode: str | None = None


@dataclass(frozen=True)
class Thresholds:
    """The times that separate normal from stuck, as the monitor set them for this snapshot."""

    hang_after_s: float  # a collective waited on this long (heartbeats alive) is a hang
    waiting_after_s: float  # longer than this in a collective shows as "waiting" (not yet a hang)
    heartbeat_stale_s: float  # no heartbeat for this long: the rank's heartbeat has stopped
    adaptive: bool = True  # False when --hang-after set it
    basis: str = ""  # how the hang threshold was chosen, in words
    # The process group's own timeout (init_process_group(timeout=...), else torch's default for
    # the backend): a wait for a busy rank is an error as it nears it, when torch fails the job.
    pg_timeout_s: float | None = None
    pg_timeout_basis: str = ""
    wait_warn_after_s: float | None = None  # a wait for a busy rank is a warning past this
    wait_error_after_s: float | None = None  # ... and an error past this
    # A wait for ranks that are all blocked (no CPU, no I/O, the very same frame) for about as
    # long as the wait itself is a hang past this, sooner than hang_after_s (None: not sooner).
    hang_blocked_after_s: float | None = None
    heartbeat_period_s: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "hang_after_s": round(self.hang_after_s, 3),
            "waiting_after_s": round(self.waiting_after_s, 3),
            "heartbeat_stale_s": round(self.heartbeat_stale_s, 3),
            "adaptive": self.adaptive,
            "basis": self.basis,
            "pg_timeout_s": self.pg_timeout_s,
            "pg_timeout_basis": self.pg_timeout_basis,
            "wait_warn_after_s": self.wait_warn_after_s,
            "wait_error_after_s": self.wait_error_after_s,
            "hang_blocked_after_s": (
                round(self.hang_blocked_after_s, 3) if self.hang_blocked_after_s else None
            ),
        }


@dataclass(frozen=True)
class CheckupNote:
    """One finding of the preflight's script checkup (doctor.json, ddpdoctor.monitor.follow.checkup), as
    a diagnosis cites it when the run shows its symptom (ddpdoctor.monitor.judge.script_citations)."""

    rule: str  # "script.collective_under_rank_guard"
    path: str  # the file as the checkup was given it (or found it, for a local module)
    line: int
    summary: str  # what the source shows and why it bites
    text: str = ""  # the source line, stripped
    block: tuple[int, int] | None = None  # rank-guard findings: the `if rank == 0:` body's lines

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    def covers(self, line: int) -> bool:
        """A rank at `line` of this file is at the flagged line, or in the guarded body."""
        if self.block is not None and self.block[0] <= line <= self.block[1]:
            return True
        return line == self.line
