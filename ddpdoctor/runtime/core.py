"""The Runtime: the one object per rank that the hooks report to and that writes the events.

Hooks never hold a Runtime of their own; they look up `active()` on every call, so a hook left
behind (a DDP comm hook cannot be unregistered, a forked DataLoader worker inherits every patch)
turns into a plain pass-through as soon as the runtime is deactivated or the process forked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddpdoctor.protocol.events import (
    ERROR,
    EXIT,
    FAULT,
    HEARTBEAT,
    HELLO,
    PHASE,
    RAY_CALL,
    SCHEMA_VERSION,
    WARNING,
)
from ddpdoctor.protocol.rank_socket import say_rank
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.runtime import info
from ddpdoctor.runtime.collectives import CollectiveTracker
from ddpdoctor.runtime.completion import CudaMarker, default_cuda_marker
from ddpdoctor.runtime.records import Record
from ddpdoctor.runtime.steps import StepTracker
from ddpdoctor.runtime.writer import EventWriter

# A closed step is written at once when it was slow (a write is then a fraction of a percent of
# it) or the last one written is this old; between, steps go with the heartbeat's flush.
STEP_WRITE_EVERY_S = 0.05
SLOW_STEP_S = 0.005


class BeatThread(Protocol):
    """The heartbeat thread as the runtime knows it (runtime/heartbeat.py builds on this module,
    so the runtime names only what it needs of it)."""

    def stop(self, timeout: float | None = 2.0) -> None: ...


# Events kept in memory while the rank is not known yet (no $RANK: it comes from the process
# group later). Beyond this, the oldest heartbeats would only repeat themselves: drop new ones.
MAX_EVENTS_BEFORE_RANK = 2000

# Written at once, with everything queued before them: what must be on disk before whatever comes
# next (a fault's os._exit, the end of the process). The rest (steps, metrics, phases, the ends
# of collectives and gradient buckets) is queued on the hot path and written by the heartbeat
# thread within milliseconds; the start of a collective says itself whether it waits
# (records.CollectiveDesc.immediate).
WRITE_NOW = frozenset({HELLO, HEARTBEAT, WARNING, FAULT, ERROR, EXIT, RAY_CALL})

# The phases ddpdoctor sets by itself (from DDP forwards) until the script names one.
AUTO_TRAIN = "train"
AUTO_EVAL = "eval"

# The runtime of this process. Hooks on the hot path read this attribute directly (a module
# attribute costs less than a call); everything else calls active().
_active: Runtime | None = None


def active() -> Runtime | None:
    """The runtime of this process, or None when ddpdoctor is not recording."""
    return _active


def set_active(runtime: Runtime | None) -> None:
    global _active
    _active = runtime


@dataclass(frozen=True)
class ExitHint:
    """How the process is about to end, as far as a hook could tell before atexit runs."""

    code: int | None
    reason: str  # "normal" | "sys.exit" | "exception" | "signal"
    signal: str | None = None


def ends_cleanly(code: int | None, reason: str) -> bool:
    """The process ends as the script meant it to (returned, or sys.exit(0)): its open step,
    if synced, is a finished step. An exception, a signal or a non-zero exit cut it short."""
    return code == 0 and reason in ("normal", "sys.exit")


class Runtime:
    """Per-rank recorder: envelope, rank, phase, step and collective state, and the exit event."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        rank: int | None,
        heartbeat_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        mono_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = RunDir(Path(run_dir))
        self.rank = rank
        self.heartbeat_s = heartbeat_s
        # fatal error events this process wrote: its heartbeats say how many, so a watcher can
        # tell an error line of its own from one appended to its file by another process
        self.fatal_errors = 0
        self.wall_clock = wall_clock
        self.mono_clock = mono_clock
        self.phase = "init"
        # True until the script names a phase itself (ddpdoctor.phase): until then the DDP hooks
        # set "train" and "eval" from what the forwards do.
        self.auto_phase = True
        self.backend: str | None = None
        self.cuda_device: int | None = None  # the GPU this rank uses, once known
        self.pg_timeout_s: float | None = None  # the default process group's timeout, once known
        self.pg_timeout_given = False  # ... given by the script (else torch's default)
        self.cuda_marker: CudaMarker | None = default_cuda_marker
        self.script: str | None = None  # what the bootstrap runs (a path, or "-m module")
        # Started by autostart at init_process_group: a rank only once it has joined; a process
        # that never joins (its init failed) is no rank and writes nothing.
        self.join_only = False
        self.world_size: int | None = None  # from the process group, once joined
        self.exit_hint: ExitHint | None = None
        self.faulthandler_ours = False  # exit_hooks enabled faulthandler (not the user)
        self.heartbeat: BeatThread | None = None  # its thread, once activate() started it
        # How DDP's gradient buckets are recorded ({"mode", "why"}: ddp_hooks.bucket_mode), said
        # in the hello event once the DDP hooks are installed.
        self.bucket_recording: dict[str, str] | None = None
        # A pipeline rank's position in its schedule (pipeline_hooks.py): [step, action,
        # microbatch, stage], replaced as it moves, read by the heartbeat thread.
        self.pipeline_position: list[Any] | None = None
        # Replica digests (replicas.py): the step at which the DDP forward wrapper next asks
        # for one (a plain integer compare per forward until then), and what runs once the
        # training is over (destroy_process_group, a clean exit)
        self.replica_next = 1 << 62
        self.at_end: list[Callable[[Runtime], None]] = []
        # More the hello says, set by a framework's hook (torchft: the rank's replica group).
        self.hello_extra: dict[str, Any] = {}
        self.finished = False
        self._finishing = False
        self.collectives = CollectiveTracker(self.record, mono_clock, wall_clock)
        self.steps = StepTracker(self.record, mono_clock, wall_clock)
        steps = self.steps
        self.collectives.step_of = lambda: steps.current
        self._lock = threading.RLock()
        self._writer: EventWriter | None = None
        self._early: list[dict[str, Any] | Record] = []
        self._undo: list[Callable[[], None]] = []
        self._on_first_queued: Callable[[], None] | None = None
        self._step_written_t = self._step_closed_t = float("-inf")
        if rank is not None:  # (torchrun's RANK: the bootstrap knows it before the script runs)
            say_rank(rank)  # before the hello reaches the file (ddpdoctor.protocol.rank_socket)
            self._writer = EventWriter(self.run_dir.events_file(rank), rank=rank)
            self.steps.sink = self._write_step

    # -- writing -------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event (never raises; silently dropped once the exit event is out)."""
        self._emit(kind, fields, last=False)

    def _emit(self, kind: str, fields: dict[str, Any], *, last: bool) -> None:
        if self.finished:
            return
        if kind == ERROR and fields.get("fatal") is True:
            self.fatal_errors += 1  # before the line: a heartbeat after it counts it
        try:
            event: dict[str, Any] = {
                "v": SCHEMA_VERSION,
                "t": self.wall_clock(),
                "mono": self.mono_clock(),
                "rank": self.rank,
                "kind": kind,
            }
            event.update(fields)
            writer = self._writer
            if writer is None:
                writer = self._keep_early(event)
                if writer is None:
                    return
            if last:
                # written and the file closed under one hold of the writer's lock: a heartbeat
                # racing it (its thread past the `finished` check) is written before it or not
                # at all, never after it
                self.collectives.write_counts()
                writer.write_last(event)
            elif kind in WRITE_NOW:
                self.collectives.write_counts()  # the calls counted before it come first
                writer.write(event)
            else:
                writer.enqueue(event)
        except Exception:  # noqa: BLE001 - recording must never break training
            pass

    def record(self, record: Record, immediate: bool = False) -> None:
        """A hot-path event (a record of records.py): queued for the writer thread, or, when
        `immediate`, on disk (after everything queued before it) when this returns."""
        writer = self._writer
        if writer is None:
            writer = self._keep_early(record)
            if writer is None:
                return
        if immediate:
            self.collectives.write_counts()  # the calls counted before it come first
            writer.write(record)
        else:
            writer.enqueue(record)

    def _write_step(self, record: Record) -> None:
        """A closed training step: on disk now when it took SLOW_STEP_S or more or the last step
        written is STEP_WRITE_EVERY_S old, else queued for the heartbeat's next flush. A rank
        killed a moment after a step (SIGKILL, the OOM killer: no exit handler runs) has every
        step it finished counted unless its steps take milliseconds, and then the training thread
        makes no system call per step."""
        writer = self._writer
        if writer is None:
            return
        now = record[2]  # when the step was closed (records.step: its mono time)
        slow = now - self._step_closed_t >= SLOW_STEP_S
        self._step_closed_t = now
        if slow or now - self._step_written_t >= STEP_WRITE_EVERY_S:
            self._step_written_t = now
            writer.write_record(record)
        else:
            writer.enqueue(record)

    def _keep_early(self, event: dict[str, Any] | Record) -> EventWriter | None:
        """Keep an event until the rank is known; the writer instead when it just became known."""
        with self._lock:
            writer = self._writer
            if writer is None and not self.finished and len(self._early) < MAX_EVENTS_BEFORE_RANK:
                self._early.append(event)
            return writer

    def flush(self) -> None:
        """Write the queued events now (the heartbeat thread does this every few milliseconds)."""
        writer = self._writer
        if writer is not None:
            writer.flush()

    def wake_on_queued(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` when an event lands in an empty queue (the heartbeat's flush nudge)."""
        self._on_first_queued = callback
        if self._writer is not None:
            self._writer.on_first_queued = callback

    @property
    def writer(self) -> EventWriter | None:
        return self._writer

    def set_rank(self, rank: int, *, guessed: bool = False) -> None:
        """The rank became known (from the process group): open its file, write what waited.
        `guessed`: not learned, only the file to write to (the launcher is told no rank)."""
        with self._lock:
            if self._writer is not None:
                return
            self.rank = rank
            if not guessed:  # before the hello reaches the file: the launcher can vouch for
                say_rank(rank)  # this process even if it ends before its first look
            writer = EventWriter(self.run_dir.events_file(rank), rank=rank)
            writer.on_first_queued = self._on_first_queued
            early, self._early = self._early, []
            for event in early:
                if isinstance(event, dict):
                    event["rank"] = rank
                    if event.get("kind") == HELLO and self.world_size:
                        # said before the rank was known: the world known now (torchft's)
                        event["world_size"] = self.world_size
                writer.enqueue(event)
            self._writer = writer
            # from now on a closed step goes to the file with what was queued before it
            self.steps.sink = self._write_step
        writer.flush()

    # -- state ---------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        return f"cuda:{self.cuda_device}" if self.cuda_device is not None else "cpu"

    def say_hello(self) -> None:
        extra = {"buckets": self.bucket_recording} if self.bucket_recording else {}
        extra.update(self.hello_extra)
        self.emit(
            HELLO,
            **info.hello_fields(
                backend=self.backend,
                device=self.device,
                script=self.script,
                heartbeat_s=self.heartbeat_s,
                world_size=self.world_size,
            ),
            pg_timeout_s=self.pg_timeout_s,
            pg_timeout_given=self.pg_timeout_given,
            # what its heartbeats say, for a watcher to check lines of its file against: the
            # call it is in, and how many fatal errors it wrote (monitor/model/own_lines.py)
            beat_fields=["open", "errors"],
            **extra,
        )

    def on_process_group(self) -> None:
        """init_process_group returned: learn rank, backend and device, and say hello again."""
        try:
            rank, world, backend, device = info.process_group_facts()
        except Exception:  # noqa: BLE001
            return
        if rank is not None and self._writer is None:
            self.set_rank(rank)
        self.world_size = world or self.world_size
        self.backend = backend or self.backend
        if device is not None:
            self.cuda_device = device
        self.say_hello()

    def set_phase(self, name: str, *, auto: bool = False) -> str:
        """Enter a phase; return the one it replaces. A phase change ends a finished step.

        A phase the script names (`auto` false) turns ddpdoctor's own guesses off for good."""
        if not auto:
            self.auto_phase = False
        previous = self.phase
        if name != previous:
            self.steps.flush()
            self.phase = name
            self.emit(PHASE, phase=name, previous=previous)
        return previous

    def run_at_end(self) -> None:
        """The training is over (the process group is destroyed, the process ends cleanly)."""
        for callback in list(self.at_end):
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - recording must never break the end of a run
                pass

    def hint_exit(self, code: int | None, reason: str, signal: str | None = None) -> None:
        self.exit_hint = ExitHint(code, reason, signal)

    def write_exit_event(self) -> None:
        """At interpreter exit (atexit): the exit event, with the code the hooks saw coming."""
        if active() is not self:
            return
        hint = self.exit_hint or ExitHint(0, "normal")
        extra = {"signal": hint.signal} if hint.signal else {}
        self.finish(hint.code, hint.reason, **extra)

    def finish(self, code: int | None, reason: str, **extra: Any) -> None:
        """Write the exit event once: the last line of this rank's file."""
        with self._lock:
            if self.finished or self._finishing:
                return
            self._finishing = True
            rank_unknown = self._writer is None
        if rank_unknown and self.join_only:  # never joined: no rank, nothing to say
            with self._lock:
                self.finished = True
                self._early = []
            return
        if rank_unknown:  # never learned its rank: the file of rank 0 is the best guess
            self.set_rank(0, guessed=True)
        self.collectives.poll()  # async ops that completed since the heartbeat last looked
        if ends_cleanly(code, reason):
            # A step still open when the process dies of an exception or a signal did not
            # finish: its gradient all-reduce may have failed (a peer was stopped). Counting it
            # would make the rank look as if it had moved past the collective it died in.
            self.steps.flush()
            self.run_at_end()
        self._emit(EXIT, {"code": code, "reason": reason, **extra}, last=True)
        self.finished = True
        if self._writer is not None:
            self._writer.close()  # (closed already, unless the exit event could not be made)

    # -- install / uninstall -------------------------------------------------------------------

    def on_deactivate(self, undo: Callable[[], None]) -> None:
        """Register how to take one hook out again (run in reverse order by deactivate)."""
        self._undo.append(undo)

    def uninstall(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001 - take out everything we can
                pass
        if self._writer is not None:
            self._writer.close()

    def forget_after_fork(self) -> None:
        """In a forked child (a DataLoader worker): this process is not the rank; stay silent."""
        self.finished = True
        self._lock = threading.RLock()
        self._undo = []
        if self._writer is not None:
            self._writer.forget_after_fork()
