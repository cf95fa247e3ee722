"""What the collective smoke test asked for and what it saw, and who is to blame when it failed.

Pure data and pure functions, so the smoke check can be tested with recorded outcomes (a rank that
hung in all_reduce, one that died, one that got wrong data) without starting processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.rank_ranges import named_ranks

STEPS = ("import", "init", "barrier", "all_reduce", "broadcast", "all_gather", "sweep", "done")
# 8 B .. 64 MiB: latency-bound small messages up to bandwidth-bound large ones.
DEFAULT_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20)
SAME_MOMENT_S = 1.0
# How a rank's error reads when a peer went away first (gloo and NCCL wordings).
CONSEQUENCE_MARKERS = (
    "closed by peer",
    "reset by peer",
    "broken pipe",
    "connection refused",
    "remote process exiting",
    "timed out",
)


@dataclass(frozen=True)
class SmokeRequest:
    nproc: int
    backend: str  # "gloo" or "nccl"
    env: Mapping[str, str] = field(default_factory=dict)  # the job's environment, for the ranks
    timeout_s: float = 60.0  # the whole run
    init_timeout_s: float = 45.0  # import torch + init_process_group, per rank
    step_timeout_s: float = 15.0  # each collective step
    sweep_timeout_s: float = 30.0
    sizes: tuple[int, ...] = DEFAULT_SIZES

    @classmethod
    def within(
        cls, total_s: float, *, nproc: int, backend: str, env: Mapping[str, str]
    ) -> SmokeRequest:
        """Step deadlines scaled to an overall budget (60 s gives 45 s init, 15 s per step)."""
        return cls(
            nproc=nproc,
            backend=backend,
            env=dict(env),
            timeout_s=total_s,
            init_timeout_s=max(5.0, total_s * 0.75),
            step_timeout_s=max(3.0, total_s / 4),
            sweep_timeout_s=max(5.0, total_s / 2),
        )


@dataclass(frozen=True)
class Measurement:
    bytes: int
    time_s: float  # per all_reduce, slowest rank
    iters: int = 1

    def algbw_gbps(self) -> float:
        """nccl-tests' algorithm bandwidth: bytes / time, in GB/s (10^9)."""
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0

    def busbw_gbps(self, world_size: int) -> float:
        """nccl-tests' bus bandwidth for all_reduce: algbw × 2(n-1)/n."""
        return self.algbw_gbps() * 2 * (world_size - 1) / world_size if world_size else 0.0


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    pid: int | None
    finished: tuple[str, ...]  # steps it reported done, in order
    current: str | None  # the last step it announced
    error: str | None = None
    error_step: str | None = None
    mismatch: Mapping[str, Any] | None = None  # where a result first differed from the truth
    exit_code: int | None = None
    killed: bool = False  # ended by the doctor at the deadline
    failed_at: float | None = None  # seconds after the start when it failed
    output_tail: str = ""

    @property
    def done(self) -> bool:
        return "done" in self.finished

    @property
    def last_finished(self) -> str | None:
        return self.finished[-1] if self.finished else None

    @property
    def progress(self) -> int:
        """How far it got: two points per finished step, one more for having started the next."""
        started_next = self.current is not None and self.current not in self.finished
        return 2 * len(self.finished) + int(started_next)

    def next_step(self) -> str:
        """The step it was in, or the one it never started."""
        if self.current is not None and self.current not in self.finished:
            return self.current
        last = self.last_finished
        if last is None:
            return "import"
        return STEPS[min(STEPS.index(last) + 1, len(STEPS) - 1)]


@dataclass(frozen=True)
class SmokeReport:
    backend: str
    world_size: int
    ranks: tuple[RankOutcome, ...]
    measurements: tuple[Measurement, ...] = ()
    elapsed_s: float = 0.0
    timed_out_step: str | None = None  # set when the doctor killed the ranks at a deadline
    stall_limit_s: float | None = None  # the deadline that ran out

    @property
    def ok(self) -> bool:
        return self.timed_out_step is None and all(r.done for r in self.ranks)

    def pids(self) -> tuple[int, ...]:
        return tuple(r.pid for r in self.ranks if r.pid is not None)


@dataclass(frozen=True)
class Blame:
    """The failure in words: the culprit ranks, the step, what happened, and the others' view."""

    ranks: tuple[int, ...]
    step: str
    what: str
    details: tuple[str, ...] = ()


def blame(report: SmokeReport) -> Blame | None:
    """Who made the smoke test fail and how; None when it passed."""
    if report.ok:
        return None
    failed = [r for r in report.ranks if r.failed_at is not None and not r.killed]
    if failed:
        return _first_failure(report, failed)
    return _hang(report)


def _first_failure(report: SmokeReport, failed: list[RankOutcome]) -> Blame:
    # The first rank to fail is the cause; peers that fail afterwards mostly see its absence
    # ("Connection closed by peer"), so they are listed as consequences, not culprits. Failures
    # noticed within a moment of each other are ordered by kind: a peer's lost connection last.
    earliest = min(r.failed_at or 0.0 for r in failed)
    close = [r for r in failed if (r.failed_at or 0.0) <= earliest + SAME_MOMENT_S]
    first = min(close, key=lambda r: (_looks_like_consequence(r), r.failed_at or 0.0))
    step = first.error_step or first.next_step()
    what = f"rank {first.rank} {_what(first)}"
    details = [what]
    for other in report.ranks:
        if other.rank == first.rank:
            continue
        if other.failed_at is not None and not other.killed:
            details.append(f"rank {other.rank} then {_what(other)}")
        elif not other.done:
            details.append(f"rank {other.rank} was in {other.next_step()} and was stopped")
    details.extend(_tail_lines(first))
    return Blame((first.rank,), step, what, tuple(details))


def _hang(report: SmokeReport) -> Blame:
    stuck = [r for r in report.ranks if not r.done]
    least = min(r.progress for r in stuck)
    behind = [r for r in stuck if r.progress == least]
    waiting = [r for r in stuck if r.progress > least]
    step = report.timed_out_step or behind[0].next_step()
    names = named_ranks(r.rank for r in behind)
    if all(r.current in r.finished or r.current is None for r in behind) and waiting:
        after = behind[0].last_finished or "start"
        what = f"{names} never started {behind[0].next_step()} (last finished: {after})"
    else:
        what = f"{names} did not finish {behind[0].next_step()}"
    limit = f" after {report.stall_limit_s:g} s without progress" if report.stall_limit_s else ""
    details = [f"{what}; killed{limit}"]
    for r in waiting:
        details.append(f"rank {r.rank} was waiting in {r.next_step()}")
    return Blame(tuple(r.rank for r in behind), step, what, tuple(details))


def _looks_like_consequence(rank: RankOutcome) -> bool:
    text = (rank.error or "").lower()
    return rank.mismatch is None and any(marker in text for marker in CONSEQUENCE_MARKERS)


def _what(rank: RankOutcome) -> str:
    if rank.mismatch:
        m = rank.mismatch
        where = f" at {m['bytes']} bytes" if "bytes" in m else ""
        return (
            f"got a wrong result in {rank.error_step}{where}: element {m.get('index')} is "
            f"{m.get('got')}, expected {m.get('expected')} "
            f"({m.get('wrong_elements')} of {m.get('elements')} elements wrong)"
        )
    if rank.error:
        return f"failed in {rank.error_step}: {rank.error}"
    if rank.exit_code is not None:
        code = rank.exit_code
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if rank.current is not None and rank.current not in rank.finished:
            return f"{how} during {rank.current}"
        if rank.last_finished is None:
            return f"{how} before reporting anything"
        return f"{how} after {rank.last_finished} (before {rank.next_step()})"
    return f"stopped answering in {rank.next_step()}"


def _tail_lines(rank: RankOutcome, count: int = 6) -> list[str]:
    lines = [line for line in rank.output_tail.splitlines() if line.strip()]
    return [f"rank {rank.rank} output: {line[:300]}" for line in lines[-count:]]
