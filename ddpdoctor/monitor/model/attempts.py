"""Attempts: a job its launcher restarts after a failure is one run of several attempts.

torchrun with `--max-restarts N` ends every rank when one fails and starts them all again: the
same ranks, new processes, `TORCHELASTIC_RESTART_COUNT` one higher (each rank's hello carries it,
and `TORCHELASTIC_MAX_RESTARTS`, the budget). A Ray Train controller with
`FailureConfig(max_failures=N)` starts a new worker group: the same world ranks in new processes.
A rank's hello from a new process of an ended one is therefore the next attempt of that rank,
never a second rank nor a survivor that vanished.

`AttemptLog` is fed every hello before the rank's tracker takes it (RunState.apply): it notes the
budget, and when a rank's process is new it records how the previous process of that rank ended
(its error and line, its exit code or signal, its step) under the attempt that process belonged
to. `view()` freezes it for the snapshot (`Snapshot.attempts`); which failure was the first of an
attempt and whether the job may still recover is the judge's (ddpdoctor.monitor.judge.rules.recovery).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ddpdoctor.monitor.model.attempt_views import (
    BUDGET_BOUND,
    Attempt,
    Attempts,
    RankEnding,
    budget_in_argv,
)
from ddpdoctor.monitor.model.event_fields import integer, num

if TYPE_CHECKING:  # pragma: no cover
    from ddpdoctor.monitor.model.rank_tracker import RankTracker


def ending_of(tracker: RankTracker, agent: Any, alive: bool | None) -> RankEnding:
    """How the tracker's process ended: `agent` is torchrun's record of its exit, if any."""
    rank, pid, step = tracker.rank, tracker.pid, tracker.step
    t = tracker.failed_t or tracker.exit_t or tracker.last_event_t
    code = tracker.exit_code
    signal = tracker.exit_signal
    if code is None and agent is not None:
        code, signal = agent.exit_code, agent.signal
    if tracker.error is not None:
        return RankEnding(
            rank, pid, True, tracker.error, tracker.error_line, t, step, signal, code, raised=True
        )
    if code == 0:
        return RankEnding(rank, pid, False, "ended normally", None, t, step, exit_code=0)
    if signal:
        return RankEnding(rank, pid, True, f"killed by {signal}", None, t, step, signal, code)
    if code is not None:
        return RankEnding(rank, pid, True, f"exit code {code}", None, t, step, exit_code=code)
    if tracker.ray_busy and tracker.ray_call:
        # a Ray worker's end is seen by no one: its raylet reports a lost connection, never the
        # signal (ray 2.60); Ray ends a worker only after the user's call returned
        call = "its training function" if tracker.ray_call == "train_fn" else tracker.ray_call
        cause = (
            f"its Ray worker was killed while running {call} (a signal, the OOM killer) or crashed"
        )
        return RankEnding(rank, pid, True, cause, None, t, step)
    how = "its process ended" if alive is False else "its process was replaced"
    return RankEnding(rank, pid, True, f"{how} without an exit event", None, t, step)


class AttemptLog:
    """The attempts as the hellos tell them (see the module's note)."""

    def __init__(self, launch_argv: Sequence[str] = ()) -> None:
        self.current = 0
        self.max_restarts: int | None = None
        self.budget_from: str | None = None
        launched = budget_in_argv(launch_argv)
        if launched is not None:
            self.max_restarts, self.budget_from = launched, "torchrun --max-restarts"
        self.of_rank: dict[int, int] = {}
        self.started_t: dict[int, float | None] = {0: None}
        self.endings: dict[int, list[RankEnding]] = {}
        self.steps: dict[int, int] = {}
        # how the previous process of the rank of the latest hello ended (None: not a new
        # process): the replica groups' log (model.replica_groups) takes it from here
        self.last_ending: RankEnding | None = None

    def hello(
        self, event: dict[str, Any], old: RankTracker | None, agent: Any, alive: bool | None
    ) -> bool:
        """A rank's hello, before its tracker takes it; `old`: the tracker as it stands.
        True when the hello is of a new process of the rank (its previous one has ended)."""
        rank, t = event["rank"], num(event.get("t"))
        self._budget(event)
        pid = integer(event.get("pid"))
        new_process = old is not None and old.pid is not None and pid is not None and pid != old.pid
        before = self.of_rank.get(rank, 0)
        count = integer(event.get("restart_count"))
        if count is not None and 0 <= count <= BUDGET_BOUND:
            number = count
        else:  # no launcher count (Ray Train): each new process of the rank is its next attempt
            number = before + 1 if new_process else before
        self.last_ending = ending_of(old, agent, alive) if new_process and old else None
        if self.last_ending is not None and old is not None and old.events_seen:
            self.endings.setdefault(before, []).append(self.last_ending)
            if old.step is not None:
                self.steps[before] = max(self.steps.get(before, old.step), old.step)
        self.of_rank[rank] = number
        if number > self.current:
            self.current = number
        first = self.started_t.get(number)
        if first is None or (t is not None and t < first):  # its earliest hello
            self.started_t[number] = t
        return new_process

    def ray_call(self, event: dict[str, Any]) -> None:
        """A Ray Train worker's training function started: its FailureConfig(max_failures)."""
        value = integer(event.get("max_failures"))
        if value is None:
            return
        self.max_restarts = BUDGET_BOUND if value < 0 else min(value, BUDGET_BOUND)
        self.budget_from = "Ray Train FailureConfig(max_failures)"

    def _budget(self, event: dict[str, Any]) -> None:
        stated = integer(event.get("max_restarts"))
        if stated is not None and 0 <= stated <= BUDGET_BOUND:
            self.max_restarts, self.budget_from = stated, "TORCHELASTIC_MAX_RESTARTS"
            return
        parent = event.get("parent")
        argv = parent.get("argv") if isinstance(parent, dict) else None
        if self.max_restarts is None and isinstance(argv, list):
            found = budget_in_argv([str(word) for word in argv[:200]])
            if found is not None:
                self.max_restarts, self.budget_from = found, "torchrun --max-restarts"

    def view(self, trackers: dict[int, RankTracker]) -> Attempts | None:
        """The frozen attempts; None for a run of one attempt with no restart budget."""
        if self.current == 0 and not self.max_restarts:
            return None
        attempts = []
        for number in range(self.current + 1):
            endings = sorted(self.endings.get(number, ()), key=lambda e: (e.t or 0.0, e.rank))
            ranks = sorted(
                {e.rank for e in endings}
                | {r for r, n in self.of_rank.items() if n == number and r in trackers}
            )
            steps = self.steps.get(number)
            if number == self.current:
                steps = max(
                    (
                        t.step
                        for r, t in trackers.items()
                        if t.step is not None and self.of_rank.get(r, 0) == number
                    ),
                    default=steps,
                )
            ended = None
            if number < self.current:  # its last process's end, else the next start seen
                later = [t for n, t in self.started_t.items() if n > number and t is not None]
                ended = max((e.t for e in endings if e.t), default=min(later, default=None))
            attempts.append(
                Attempt(
                    number, self.started_t.get(number), ended, tuple(ranks), steps, tuple(endings)
                )
            )
        return Attempts(
            tuple(attempts),
            self.max_restarts,
            self.budget_from,
            tuple(sorted(self.of_rank.items())),
        )
