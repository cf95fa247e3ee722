"""The verdicts and rank states of diagnosis.json (`verdict`, `ranks[].state`): the words every
layer that reads or acts on a diagnosis shares (the monitor decides them, the launcher stops a job
on them, the views show them)."""

from __future__ import annotations

from enum import Enum


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
        # (a set of the values: `RankState.DONE` is a lookup through the enum's metaclass, and
        # the rules ask this of every rank at every poll, 32,768 of them at 4096 nodes)
        return self._value_ in _FINISHED


class Verdict(str, Enum):
    RUNNING = "running"
    HEALTHY = "healthy"
    HANG = "hang"
    MISMATCH = "mismatch"
    CRASH = "crash"
    # The run is over and no rank ever reported: the launch's doctor failed, torchrun ended
    # before starting a rank (or a node never joined), or no rank could write its events.
    NOT_STARTED = "not_started"
    # The user stopped the run (Ctrl-C, SIGTERM to the launcher) before any problem was found:
    # the ranks that then failed were stopped, they did not crash.
    INTERRUPTED = "interrupted"
    # The command ran and ended, and none of its processes joined a process group (accelerate
    # launch --cpu, a script that never calls init_process_group): nothing distributed to judge.
    NOT_DISTRIBUTED = "not_distributed"
    # The command ran and ended, but ddpdoctor's runtime could not load in its processes
    # (python -I / -E / -S, a Python without ddpdoctor importable, a program that is no Python).
    NOT_INSTRUMENTED = "not_instrumented"

    @property
    def is_problem(self) -> bool:
        return self._value_ in _PROBLEMS


class ActivityState(str, Enum):
    """What a rank that is not finished is doing right now (diagnosis.json `ranks[].activity`),
    judged from its heartbeats' CPU time, I/O bytes and main-thread frame, and on GPUs from its
    GPU utilization. Only a blocked rank can be the culprit of a hang; a busy one makes others
    wait."""

    IN_COLLECTIVE = "in_collective"  # inside a collective (waiting for, or working with, others)
    BUSY = "busy"  # in its own code, making progress: CPU advancing, stack moving, I/O flowing
    GPU_WAIT = "gpu_wait"  # its main thread idle while its GPU works (a sync, .item(), .cpu())
    BLOCKED = "blocked"  # idle: sleep, a lock, a queue, a quiet socket, a dead DataLoader worker

    @property
    def progressing(self) -> bool:
        return self._value_ in _PROGRESSING


_FINISHED = frozenset(s.value for s in (RankState.DONE, RankState.FAILED, RankState.GONE))
_PROBLEMS = frozenset(
    v.value for v in (Verdict.HANG, Verdict.MISMATCH, Verdict.CRASH, Verdict.NOT_STARTED)
)
_PROGRESSING = frozenset(a.value for a in (ActivityState.BUSY, ActivityState.GPU_WAIT))
