"""What the monitor knows about one rank, accumulated event by event (mutable, owned by RunState).

Every field comes from the rank's own events (ddpdoctor/protocol/events.py), so a live run, a finished one
and a copied directory are read the same way. Values of the wrong type are ignored, never trusted:
a rank's file may be torn or written by another ddpdoctor version.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ddpdoctor.monitor.model import call_events, own_lines
from ddpdoctor.monitor.model.event_fields import integer, median, num, text
from ddpdoctor.monitor.model.pipeline_view import PipelineView, from_event, with_position
from ddpdoctor.monitor.model.progress import ProgressSample, ProgressTrack
from ddpdoctor.monitor.model.replicas import ReplicaTrack
from ddpdoctor.monitor.model.snapshot import (
    CALL_WINDOW,
    POINT_TO_POINT_OPS,
    CollectiveView,
    LogLine,
)
from ddpdoctor.protocol import events as ev

RECENT_STEPS = 32  # step times kept for sparklines
OWN_WORK_WINDOW = 10  # steps averaged for the straggler analysis
RECENT_COLLECTIVES = 16  # collectives kept per rank for the mismatch comparison
MAX_WARNINGS = 16
MAX_LOADERS = 32  # DataLoaders kept per rank (a script may make an eval loader every epoch)
ERROR_LINES = 6

# Kinds that mean the rank did something (a heartbeat alone only means its thread is alive).
_PROGRESS_KINDS = frozenset(
    {
        ev.HELLO,
        ev.PHASE,
        ev.STEP,
        ev.EPOCH,
        ev.COLLECTIVE_START,
        ev.COLLECTIVE_END,
        ev.FAULT,
        ev.METRICS,
        ev.WARNING,
        ev.RAY_CALL,
    }
)  # errors and exits end a rank; they are not progress


class RankTracker:
    """The accumulated state of one rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.host: str | None = None
        self.pid: int | None = None
        self.local_rank: int | None = None
        self.ppid: int | None = None  # its node's torchrun (which launcher owns it)
        self.parent_argv: tuple[str, ...] = ()  # that launcher's command line, when the hello said
        self.group_rank: int | None = None  # torchrun's node number (GROUP_RANK)
        self.ray_actor: str | None = None  # a Ray worker's actor name (or class), from its hello
        self.world_size: int | None = None
        self.backend: str | None = None
        self.hello_t: float | None = None
        self.first_t: float | None = None
        self.rss_bytes: int | None = None
        self.gpu_mem_bytes: int | None = None
        self.events_seen = 0
        # an exit line (and its error) that this process's later events contradicted
        self.contradicted: str | None = None
        # its exit line is doubted: its process, seen alive, still holds its event file open
        self.exit_doubted = False
        # calls its events number out of its own order (a line someone else appended): what
        # the first such said, and how many (ddpdoctor.monitor.model.call_events.dispute)
        self.disputed: str | None = None
        self.disputed_calls = 0
        # counts every change (an event, an error line): a view of it is rebuilt only then
        self.version = 0
        self.error_lines: deque[LogLine] = deque(maxlen=ERROR_LINES)
        self.agent_exit_code: int | None = None  # from torchrun's log, for ranks with no exit event
        self.pg_timeout_s: float | None = None  # the default process group's timeout (hello)
        self.pg_timeout_given = False  # ... set by the script's timeout= (else torch's default)
        # its latest view and the version it was made of, where a view stands until it changes
        # (a rank its node's rows make: RunState._view)
        self.view: Any = None
        self.view_version = -1
        self.view_until = 0.0  # ... until when its state cannot change without a new record
        self.view_key: tuple[float, ...] = ()  # ... under these thresholds
        self.beats_disputed: str | None = None  # why its heartbeats were disputed (own_lines)
        self.disputed_beats = 0
        self._reset_progress()

    def _reset_progress(self) -> None:
        """Everything one attempt of the rank's process accumulates (a restart starts again)."""
        self.phase: str | None = None
        self.step: int | None = None
        self.step_forwards: int | None = None  # forwards in its latest step (micro-batches)
        self.epoch: int | None = None
        self.loss: float | None = None
        self.step_time_s: float | None = None
        self.data_time_s: float | None = None
        self.compute_time_s: float | None = None
        self.comm_wait_s: float | None = None
        self.samples_per_s: float | None = None
        self.step_times: deque[float] = deque(maxlen=RECENT_STEPS)
        # data time, compute time and comm wait of the recent steps, a column each (None where
        # a step did not say): medians of each are taken after every step of every rank
        self.own_work: tuple[deque[float | None], ...] = tuple(
            deque(maxlen=OWN_WORK_WINDOW) for _ in range(3)
        )
        self._means: tuple[float | None, float | None, float | None, int] | None = None
        self.opens: dict[tuple[str, int], CollectiveView] = {}
        self.group_seqs: dict[str, int] = {}
        self.start_seqs: dict[str, int] = {}  # the last number a collective_start line gave
        self.denials: dict[tuple[str, int], int] = {}  # (call_events.deny_unended)
        # calls whose start line nothing of the process has borne out yet (call_events.bear)
        self.unborne: set[tuple[str, int]] = set()
        # ... of another node's rank: calls its summary named, no later write bore out (row_claims)
        self.claimed: set[tuple[str, int]] = set()
        self.reports_calls = False  # its heartbeats say which call it is in
        self.recent: deque[CollectiveView] = deque(maxlen=RECENT_COLLECTIVES)
        # The same, when a row of its node made this record (rank_rows): its node's ranks
        # share one tuple of their calls, and `recent` stays empty.
        self.recent_view: tuple[CollectiveView, ...] | None = None
        self.collectives_done = 0
        self.last_event_t: float | None = None
        self.last_progress_t: float | None = None
        self.last_heartbeat_t: float | None = None
        self.heartbeat_period: float | None = None
        self.last_event: str | None = None
        self.fault: str | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        self.error_t: float | None = None
        self.error_at: tuple[str, int] | None = None
        self.error_line: str | None = None  # "train.py:17 in main": the user's line (location)
        # A fatal error line is the process's own once its runtime's heartbeats count it
        # (`errors`): until then it is unconfirmed (the rank is not failed while its process
        # runs); two heartbeats that count fewer contradict it.
        self.fatal_errors = 0  # fatal error lines of this process read
        self.counts_errors = False  # its heartbeats count them (`errors`)
        self.error_unconfirmed = False
        self.beats_against_error = 0
        self.exit_code: int | None = None
        self.exit_reason: str | None = None
        self.exit_t: float | None = None
        self.exit_signal: str | None = None
        self.warnings: dict[str, str] = {}
        self.epoch_batches: int | None = None
        self.epoch_of_batches: int | None = None
        # loader id -> batches of its latest epoch outside torch's Join: loaders made only on
        # some ranks (rank 0's evaluation loader) are not compared with the others' training one
        self.loader_batches: dict[int, int] = {}
        self.failed_collective: CollectiveView | None = None
        # In a Ray worker: whether the user's code runs (ray_call events; None: not said). Ray
        # ends a worker without exit handlers once its code has returned: not a death.
        self.ray_busy: bool | None = None
        self.ray_call: str | None = None  # ... the call that runs (train_fn, a method's name)
        self._calls_key: int | None = None
        self.progress = ProgressTrack()
        self.beat_seq: int | None = None  # the last heartbeat number of its process
        self.pipeline: PipelineView | None = None  # its pipeline schedule and position
        self.sends_p2p = False  # it made a point-to-point call (call_events)
        self.replicas = ReplicaTrack()  # its replica digests (replicas.py)

    # -- applying events -------------------------------------------------------------------

    def apply(self, event: dict[str, Any], where: tuple[str, int] | None = None) -> None:
        kind = event["kind"]
        if kind in _CALL_KINDS:
            self._calls_key = None
            self.recent_view = None
        t = num(event.get("t"))
        if self.exit_code is not None and not (kind == ev.HELLO and self._new_pid(event)):
            self.exit_contradicted(f"then its {kind} events went on")
        self.events_seen += 1
        self.version += 1
        if t is not None:
            if self.first_t is None:
                self.first_t = t
            if self.last_event_t is None or t > self.last_event_t:
                self.last_event_t = t
            if kind in _PROGRESS_KINDS:
                self.last_progress_t = t
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event, t, where)

    def _hello(self, e: dict[str, Any], t: float | None, where) -> None:
        pid = integer(e.get("pid"))
        if self.pid is not None and pid is not None and pid != self.pid:
            self._reset_progress()  # torchrun restarted the rank: a new attempt
            self.last_event_t = self.last_progress_t = t
            # what the logs and torchrun said of the previous process is its attempt's
            # (model.attempts keeps its ending), not this process's
            self.error_lines.clear()
            self.agent_exit_code = None
        self.pid = pid if pid is not None else self.pid
        self.beat_seq = None  # a runtime says hello before it beats, numbering from 1
        self.host = text(e.get("host")) or self.host
        self.local_rank = integer(e.get("local_rank"))
        self.ppid = integer(e.get("ppid"))
        parent = e.get("parent")
        if isinstance(parent, dict) and isinstance(parent.get("argv"), list):
            self.parent_argv = tuple(str(word) for word in parent["argv"])
        self.group_rank = integer(e.get("group_rank"))
        self.world_size = integer(e.get("world_size")) or self.world_size
        self.backend = text(e.get("backend")) or self.backend
        if num(e.get("pg_timeout_s")):
            self.pg_timeout_s = num(e.get("pg_timeout_s"))
            self.pg_timeout_given = e.get("pg_timeout_given") is True
        ray = e.get("ray")
        if isinstance(ray, dict):
            self.ray_actor = text(ray.get("actor_name")) or text(ray.get("actor_class"))
            if isinstance(ray.get("busy"), bool):
                self.ray_busy = ray["busy"]
                calls = ray.get("calls")
                self.ray_call = (
                    text(calls[0]) if ray["busy"] and isinstance(calls, list) and calls else None
                )
        beats = e.get("beat_fields")  # what its runtime's heartbeats say (own_lines.py)
        if isinstance(beats, list):
            self.reports_calls = self.reports_calls or "open" in beats
            self.counts_errors = self.counts_errors or "errors" in beats
        self.hello_t = t
        self.last_event = "hello"

    def _ray_call(self, e: dict[str, Any], t: float | None, where) -> None:
        state = text(e.get("state"))
        if state in ("busy", "idle"):
            self.ray_busy = state == "busy"
            self.ray_call = text(e.get("call")) if self.ray_busy else None

    def _heartbeat(self, e: dict[str, Any], t: float | None, where) -> None:
        own = own_lines.own_beat(self, e)
        if t is not None:
            if self.last_heartbeat_t is not None and 0 < t - self.last_heartbeat_t < 30:
                gap = t - self.last_heartbeat_t
                prev = self.heartbeat_period
                self.heartbeat_period = gap if prev is None else 0.8 * prev + 0.2 * gap
            self.last_heartbeat_t = t
        step = integer(e.get("step"))
        if step is not None and (self.step is None or step > self.step):
            self.step = step
            self.last_progress_t = t
        phase = text(e.get("phase"))
        if phase is not None and phase != self.phase:
            self.phase = phase
            self.last_progress_t = t
        epoch = integer(e.get("epoch"))
        if epoch is not None:
            self.epoch = epoch
        if t is not None and "cpu_s" in e:
            self.progress.add(
                ProgressSample(
                    t,
                    num(e.get("cpu_s")),
                    integer(e.get("io_bytes")),
                    text(e.get("frame")),
                    text(e.get("where")),
                    num(e.get("runq_s")),
                    num(e.get("child_cpu_s")),
                )
            )
        if "errors" in e:
            self.counts_errors = True
        if self.error_unconfirmed and own:
            own_lines.weigh_error(self, integer(e.get("errors")))
        self.rss_bytes = integer(e.get("rss_bytes")) or self.rss_bytes
        self.gpu_mem_bytes = integer(e.get("gpu_mem_bytes")) or self.gpu_mem_bytes
        if own:
            call_events.open_from_heartbeat(self, e, t)
        if "pipeline" in e:
            self.pipeline = with_position(e.get("pipeline"), self.pipeline)

    def _pipeline(self, e: dict[str, Any], t: float | None, where) -> None:
        self.pipeline = from_event(e, self.pipeline)

    def _step(self, e: dict[str, Any], t: float | None, where) -> None:
        step = integer(e.get("step"))
        if step is not None:
            self.step = step
        self.step_forwards = integer(e.get("forwards")) or self.step_forwards
        self.epoch = integer(e.get("epoch")) if e.get("epoch") is not None else self.epoch
        loss = num(e.get("loss"))
        if loss is not None:
            self.loss = loss
        self.step_time_s = num(e.get("step_time_s"))
        self.data_time_s = num(e.get("data_time_s"))
        self.compute_time_s = num(e.get("compute_time_s"))
        self.comm_wait_s = num(e.get("comm_wait_s"))
        self.samples_per_s = num(e.get("samples_per_s"))
        if self.step_time_s is not None:
            self.step_times.append(self.step_time_s)
        for column, value in zip(
            self.own_work, (self.data_time_s, self.compute_time_s, self.comm_wait_s), strict=True
        ):
            column.append(value)
        self._means = None
        self.last_event = f"step {step}"

    def _metrics(self, e: dict[str, Any], t: float | None, where) -> None:
        loss = num(e.get("loss"))
        if loss is not None:
            self.loss = loss
        step = integer(e.get("step"))
        if step is not None and (self.step is None or step > self.step):
            self.step = step

    def _phase(self, e: dict[str, Any], t: float | None, where) -> None:
        self.phase = text(e.get("phase")) or self.phase
        self.last_event = f"phase {self.phase}"

    def _epoch(self, e: dict[str, Any], t: float | None, where) -> None:
        epoch = integer(e.get("epoch"))
        if epoch is not None:
            self.epoch = epoch
        batches = integer(e.get("batches"))
        if batches is not None:
            self.epoch_batches = batches
            self.epoch_of_batches = epoch
            loader = integer(e.get("loader")) or 0  # runtimes before loader ids: one loader
            if e.get("join") is True:  # evened by torch's Join: not compared (rules/sampler)
                self.loader_batches.pop(loader, None)
            elif loader in self.loader_batches or len(self.loader_batches) < MAX_LOADERS:
                self.loader_batches[loader] = batches
            else:  # the oldest loader makes room
                del self.loader_batches[next(iter(self.loader_batches))]
                self.loader_batches[loader] = batches
        self.last_event = f"epoch {epoch}"

    def _replica_digest(self, e: dict[str, Any], t: float | None, where) -> None:
        self.replicas.apply(e)

    def _warning(self, e: dict[str, Any], t: float | None, where) -> None:
        code = text(e.get("code")) or "warning"
        if code in self.warnings or len(self.warnings) < MAX_WARNINGS:
            self.warnings[code] = text(e.get("message")) or code
        self.last_event = f"warning {code}"

    def _fault(self, e: dict[str, Any], t: float | None, where) -> None:
        kind = text(e.get("fault")) or "fault"
        self.fault = text(e.get("inject")) or kind
        self.last_event = f"fault {kind}"

    def _new_pid(self, event: dict[str, Any]) -> bool:
        pid = integer(event.get("pid"))
        return pid is not None and pid != self.pid

    def exit_contradicted(self, why: str) -> None:
        """Its exit or error line is not its process's own (ddpdoctor.monitor.model.own_lines)."""
        own_lines.contradict(self, why)

    # -- derived facts ---------------------------------------------------------------------

    @property
    def failed_t(self) -> float | None:
        """When the rank failed: its fatal error, or its non-zero exit (None: not failed)."""
        if self.error_t is not None:
            return self.error_t
        if self.exit_code not in (None, 0):
            return self.exit_t
        return None

    def current_collective(self, *, borne: bool = False) -> CollectiveView | None:
        """The oldest collective still open (the one the rank waits in); `borne`: of those its
        process has borne out (call_events.bear), as a live rank's view shows them."""
        opens = self.opens
        if borne and (self.unborne or self.claimed):
            held = self.unborne | self.claimed
            opens = {k: c for k, c in opens.items() if k not in held}
        if not opens:
            return None
        if len(opens) == 1:
            return next(iter(opens.values()))
        return min(opens.values(), key=lambda c: (c.since_t or 0.0, c.seq))

    def own_work_means(self) -> tuple[float | None, float | None, float | None, int]:
        """Typical data time, compute time and comm wait over the recent steps (medians: one
        long step, rank 0 evaluating or saving a checkpoint inside it, does not make a
        straggler), and how many steps."""
        if self._means is None:
            self._means = self._compute_means()
        return self._means

    def _compute_means(self) -> tuple[float | None, float | None, float | None, int]:
        steps = len(self.own_work[0])
        if not steps:
            return None, None, None, 0
        typical = [median([v for v in column if v is not None]) for column in self.own_work]
        return typical[0], typical[1], typical[2], steps

    def borne_calls(self) -> tuple[CollectiveView, ...]:
        """Its latest calls that its process has borne out (call_events.bear): a start line
        alone, with nothing of the process after it, may be another process's."""
        calls = self.latest_calls()
        held = self.unborne | self.claimed if self.unborne or self.claimed else None
        return tuple(c for c in calls if (c.group, c.seq) not in held) if held else calls

    def latest_calls(self) -> tuple[CollectiveView, ...]:
        """Its latest calls, oldest first (what RankView.recent_collectives holds)."""
        return self.recent_view if self.recent_view is not None else tuple(self.recent)

    def calls_key(self) -> int:
        """A fingerprint of the latest calls (see RankView.calls_key), recomputed after a change."""
        if self._calls_key is None:
            calls = list(self.latest_calls()[-CALL_WINDOW:])
            current = self.current_collective()
            if current is not None and all(
                (c.group, c.seq) != (current.group, current.seq) for c in calls
            ):
                calls.append(current)
            self._calls_key = (
                hash(
                    tuple(
                        (c.group, c.seq, c.signature())
                        for c in calls
                        if c.op not in POINT_TO_POINT_OPS
                    )
                )
                or 1
            )
        return self._calls_key

    def add_error_line(self, line: LogLine) -> None:
        self.error_lines.append(line)
        self.version += 1


# Events that can change the latest calls of a rank.
_CALL_KINDS = frozenset({ev.COLLECTIVE_START, ev.COLLECTIVE_END, ev.HEARTBEAT, ev.HELLO})

_HANDLERS = {
    ev.HELLO: RankTracker._hello,
    ev.HEARTBEAT: RankTracker._heartbeat,
    ev.COLLECTIVE_START: call_events.collective_start,
    ev.COLLECTIVE_END: call_events.collective_end,
    ev.STEP: RankTracker._step,
    ev.METRICS: RankTracker._metrics,
    ev.PHASE: RankTracker._phase,
    ev.EPOCH: RankTracker._epoch,
    ev.WARNING: RankTracker._warning,
    ev.FAULT: RankTracker._fault,
    ev.ERROR: own_lines.error_event,
    ev.EXIT: own_lines.exit_event,
    ev.RAY_CALL: RankTracker._ray_call,
    ev.PIPELINE: RankTracker._pipeline,
    ev.REPLICA_DIGEST: RankTracker._replica_digest,
}
