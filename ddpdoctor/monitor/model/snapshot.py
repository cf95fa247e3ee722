"""Frozen snapshots of a run: the only thing the TUI, the headless text view and the JSON output see.

The monitor (RunState + diagnosis rules) builds one Snapshot per poll. Everything here is immutable
and cheap to compare, so a view can diff the previous snapshot against the next and update only
what changed. `Snapshot.diagnosis_json()` is RUN_DIR/diagnosis.json and `watch --json` (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.model.attempt_views import Attempts
from ddpdoctor.monitor.model.launchers import LauncherView
from ddpdoctor.monitor.model.network import NodeNetwork
from ddpdoctor.monitor.model.pipeline_view import PipelineView
from ddpdoctor.monitor.model.replica_groups import TorchftView
from ddpdoctor.monitor.model.run_facts import CheckupNote, LogLine, RunInfo, Thresholds
from ddpdoctor.protocol.flight_recorder import FrRank
from ddpdoctor.protocol.verdicts import ActivityState, RankState, Verdict
from ddpdoctor.stacks.groups import StackGroup

SCHEMA_VERSION = 1
T = TypeVar("T")

# Collectives whose tensors have one shape and dtype on every rank: a difference at one sequence
# number is a mismatch. Others (object collectives, gather/scatter roots, all_to_all splits) may differ.
SHAPE_AGREEING_OPS = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor"}
    | {"reduce_scatter", "reduce_scatter_tensor"}
    # what FSDP2 and the functional collectives (DTensor, tensor parallelism) call
    | {"all_gather_single", "reduce_scatter_single", "all_gather_tensor"}
)
# How many of each rank's latest calls the mismatch rule compares across ranks.
CALL_WINDOW = 8
# Point-to-point ops pair two ranks: their sequence numbers are not comparable across the group.
POINT_TO_POINT_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})


@dataclass(frozen=True)
class CallSite:
    """Where a rank called a collective (the event's `site`, ddpdoctor/runtime/call_sites.py):
    the user's frame, the framework function it called (`via`) and the framework frame that
    called torch.distributed (`issuer`), each "file:line function" ("" when absent)."""

    user: str
    via: str = ""
    issuer: str = ""
    file: str = ""  # the user's file, as the rank named it (for evidence)
    line: int | None = None
    # the user's call was carried out later by the framework, from its own loop (a metric
    # logged with sync_dist that Lightning reduces at the epoch's end)
    deferred: bool = False
    # the user's line that called the site's function ("fsdp_ckpt.py:37 train"; "" when the site
    # is at the script's top level or none was recorded), and its file and line for evidence
    caller: str = ""
    caller_file: str = ""
    caller_line: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What tells two calls' sites apart."""
        return (self.user, self.via, self.issuer)

    def describe(self) -> str:
        """ "lit_job.py:24 Model.on_train_epoch_end via DDPStrategy.barrier", as diagnoses say."""
        text = self.user
        via = self.via.rpartition(" ")[2]
        issuer = self.issuer.rpartition(" ")[2]
        if via:
            text += f" via {via}"
            if issuer and issuer != via:
                text += f" > {issuer}"
        if self.deferred:
            text += ", synced later by the framework"
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "user": self.user,
            "via": self.via or None,
            "issuer": self.issuer or None,
        }
        if self.deferred:
            out["deferred"] = True
        return out


@dataclass(frozen=True)
class CollectiveView:
    op: str
    seq: int
    waiting_s: float
    group: str = "default"
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    since_t: float | None = None  # unix time the collective started on this rank
    group_ranks: tuple[int, ...] | None = None  # members of `group` (None: the whole world)
    done: bool = False  # completed on this rank (recent_collectives keep finished ones too)
    site: CallSite | None = None  # where the rank called it (explicit collectives, not buckets)
    peers: tuple[int, ...] = ()  # point-to-point: the global ranks it sends to / receives from
    step: int | None = None  # the training step the rank made it in (a runtime that says)

    def same_call(self, other: CollectiveView) -> bool:
        """Whether two ranks' calls at one sequence number agree (op, and shapes/dtypes where known)."""
        return self.signature() == other.signature()

    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]:
        """What must agree across ranks for this call: op, plus shapes and dtypes for the ops whose
        tensors have the same shape on every rank (object collectives, gather/scatter and all_to_all
        legitimately differ). A shape counts by its layout, without dimensions of size 1: the
        backend sees a flat buffer, so [] and [1] (a norm reduced as a scalar on one rank, a
        one-element tensor on another) agree, while [4, 3] and [3, 4] do not."""
        sig = self.__dict__.get("_signature")
        if sig is None:  # computed once per call record; the monitor compares it every poll
            if self.op in SHAPE_AGREEING_OPS:
                layouts = tuple(tuple(d for d in shape if d != 1) for shape in self.shapes)
                sig = (self.op, layouts, self.dtypes)
            else:
                sig = (self.op, (), ())
            object.__setattr__(self, "_signature", sig)
        return sig

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
            "since_t": self.since_t,
            "seq": self.seq,
            "waiting_s": round(self.waiting_s, 3),
            "group": self.group,
            "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes),
            "site": self.site.to_json() if self.site is not None else None,
            **({"peers": list(self.peers)} if self.peers else {}),
        }


@dataclass(frozen=True, slots=True)  # (one per rank per view: no __dict__ of its own)
class Activity:
    """What a live rank is doing (ddpdoctor.monitor.model.progress): in a collective, busy in its own
    code, waiting on its GPU, or blocked."""

    state: ActivityState
    cpu_pct: float | None  # its process's CPU over the last few heartbeats (100: one core)
    where: str | None  # "train.py:88 evaluate": the user's innermost frame (else the innermost)
    since_s: float | None  # how long it has been in this state
    frame: str | None = None  # the innermost frame of its main thread
    child_cpu_pct: float | None = None  # its children's CPU (DataLoader workers), local ranks
    gpu_util_pct: float | None = None  # its GPU utilization (NVML), local ranks on GPUs

    def describe(self) -> str:
        """ "busy in train.py:88 evaluate (CPU 100%)" """
        words = {
            ActivityState.BUSY: "busy",
            ActivityState.BLOCKED: "blocked",
            ActivityState.GPU_WAIT: "waiting on its GPU",
            ActivityState.IN_COLLECTIVE: "in a collective",
        }[self.state]
        text = words + (f" in {self.where}" if self.where else "")
        facts = []
        if self.cpu_pct is not None:
            facts.append(f"CPU {self.cpu_pct:.0f}%")
        if self.child_cpu_pct is not None and self.child_cpu_pct >= 1:
            facts.append(f"workers CPU {self.child_cpu_pct:.0f}%")
        if self.gpu_util_pct is not None:
            facts.append(f"GPU {self.gpu_util_pct:.0f}%")
        return text + (f" ({', '.join(facts)})" if facts else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "cpu_pct": None if self.cpu_pct is None else round(self.cpu_pct, 1),
            "where": self.where,
            "since_s": None if self.since_s is None else round(self.since_s, 3),
            "frame": self.frame,
            "child_cpu_pct": None if self.child_cpu_pct is None else round(self.child_cpu_pct, 1),
            "gpu_util_pct": None if self.gpu_util_pct is None else round(self.gpu_util_pct, 1),
        }


@dataclass(frozen=True)
class RankView:
    rank: int
    state: RankState
    host: str | None = None
    pid: int | None = None
    actor: str | None = None  # a Ray worker's actor (name, else class)
    ray_call: str | None = None  # ... the user's call it runs (train_fn, a method), if any
    local_rank: int | None = None
    phase: str | None = None
    step: int | None = None
    step_forwards: int | None = None  # forwards in its latest step (> 1: no_sync micro-batches)
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
    exit_reason: str | None = None  # the exit event's reason: "normal", "exception", "signal", ...
    last_event_t: float | None = None  # unix time of its latest event (heartbeats included)
    last_progress_t: float | None = None  # ... of its latest progress (anything but a heartbeat)
    last_heartbeat_t: float | None = None
    fault: str | None = None  # an injected fault it recorded ("hang:rank=1,step=5")
    warnings: tuple[tuple[str, str], ...] = ()  # (code, message) of its warning events
    epoch_batches: int | None = None  # batches in its loader for the latest epoch it started
    # (loader id, batches of that loader's latest epoch) for each DataLoader it iterated; ids
    # count a rank's loaders in the order it made them
    loader_batches: tuple[tuple[int, int], ...] = ()
    avg_data_time_s: float | None = None  # medians over its recent steps (straggler analysis)
    avg_compute_time_s: float | None = None
    avg_comm_wait_s: float | None = None
    avg_steps: int = 0  # how many recent steps those means cover
    runq_share: float | None = None  # recent wall time its main thread waited for a CPU
    error_at: tuple[str, int] | None = None  # (file, line) of its error event
    error_line: str | None = None  # "train.py:17 in main": where in the user's code it raised
    error_lines: tuple[LogLine, ...] = ()  # its latest warn/error log lines (stderr, NCCL)
    # Equal for two ranks whose latest calls (recent_collectives' tail and the open one) are the
    # same sequence; lets the mismatch rule compare one rank per class at 1000s of ranks (0: unset)
    calls_key: int = 0
    activity: Activity | None = None  # None: not known (finished, no progress facts yet)
    reports_progress: bool = False  # its heartbeats carry progress facts (cpu_s)
    joined: bool = False  # it joined a process group (a hello with a backend, a call, a step)
    pipeline: PipelineView | None = None  # a pipeline rank's schedule, stages and position
    sends_p2p: bool = False  # it made point-to-point calls (a pipeline stage, a send/recv exchange)
    # its replica digests, by model and step: replicas.ReplicaDigest (which builds on this
    # module, hence Any), compared across ranks by judge/rules/replicas.py
    replica_digests: tuple[Any, ...] = ()
    restarts: int = 0  # how many times its launcher restarted it (its process's attempt)

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
            **({"actor": self.actor} if self.actor else {}),
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
            "exit_signal": self.exit_signal,
            "fault": self.fault,
            "failed_t": self.failed_t,
            "last_progress_t": self.last_progress_t,
            "activity": self.activity.to_json() if self.activity else None,
            **({"pipeline": self.pipeline.to_json()} if self.pipeline else {}),
            **({"restarts": self.restarts} if self.restarts else {}),
        }


def build_frozen(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of a frozen dataclass from a complete dict of its fields, without running the
    generated __init__ (which sets every field through object.__setattr__): the monitor builds a
    RankView per rank per poll, and at 1000s of ranks that init is its largest cost. Fields left
    out take their class-level defaults; the instance is as frozen as any other."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


@dataclass(frozen=True)
class WaitView:
    """Ranks waiting in one collective for ranks that have not reached it (diagnosis.json
    `waits`): a hang when those are blocked, a wait when they are busy."""

    waiters: tuple[int, ...]
    on: tuple[int, ...]  # the ranks not there yet
    collective: CollectiveView  # as the longest waiter sees it
    waiting_s: float  # the longest waiter's wait
    activity: Activity | None  # of the first rank waited on (None: unknown)
    busy: bool  # every rank waited on is making progress: a wait, not a hang
    severity: str | None = None  # "info" | "warning" | "error" for a wait, None otherwise
    timeout_s: float | None = None  # the process group's timeout
    timeout_in_s: float | None = None  # until the longest waiter's collective times out
    summary: str = ""  # "ranks 1-7 wait 20 s for rank 0, busy in train.py:88 evaluate (CPU 100%)"

    def to_json(self) -> dict[str, Any]:
        return {
            "waiters": list(self.waiters),
            "on": list(self.on),
            "collective": self.collective.to_json(),
            "waiting_s": round(self.waiting_s, 3),
            "busy": self.busy,
            "activity": self.activity.to_json() if self.activity else None,
            "severity": self.severity,
            "timeout_s": self.timeout_s,
            "timeout_in_s": None if self.timeout_in_s is None else round(self.timeout_in_s, 3),
            "summary": self.summary,
        }


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
    thresholds: Thresholds | None = None
    live: bool = True  # False: nothing of the run is alive any more; times are the record's end
    problem_started_t: float | None = None  # when the problem began (culprit's last progress, ...)
    # A job over several nodes whose ranks have not started: the launchers (--node-rank) that
    # have not recorded themselves in the run directory, which torchrun's rendezvous waits for.
    nodes_missing: tuple[int, ...] = ()
    # The processes that started the ranks and are no rank themselves (monitor/launchers.py).
    launchers: tuple[LauncherView, ...] = ()
    waits: tuple[WaitView, ...] = ()  # who waits for whom right now (see WaitView)
    # The verdict is certain enough to stop the job on (the stop policy): a mismatch, a crash, or
    # a hang whose culprits are confirmed blocked, gone, or silent (heartbeat stopped).
    confirmed: bool = False
    # Each rank's latest flight-recorder dump (PyTorch's record of its backend's collectives),
    # as it answered the monitor's last request (ddpdoctor.protocol.flight_recorder), by rank.
    flight_recorder: tuple[FrRank, ...] = ()
    fr_status: str | None = None  # "asked 12:01:03", "2/2 ranks answered 12:01:04", ...
    # The preflight's script checkup findings (read from doctor.json once), which diagnoses cite.
    checkup: tuple[CheckupNote, ...] = ()
    network: tuple[NodeNetwork, ...] = ()  # the nodes' looks at a stall (follow.net_watch)
    attempts: Attempts | None = None  # a run its launcher restarts (None: one attempt, no budget)
    # torchft's replica groups, quorums, heals and earlier processes (model.replica_groups)
    torchft: TorchftView | None = None
    # calls paired by chance, as the monitor read them: model.pairings.PairingsView (which
    # builds on this module, hence Any)
    pairings: Any = None

    def fr_of(self, rank: int) -> FrRank | None:
        return next((d for d in self.flight_recorder if d.rank == rank), None)

    def rank(self, rank: int) -> RankView | None:
        """The view of one rank (ranks are sorted by rank, usually dense from 0)."""
        if 0 <= rank < len(self.ranks) and self.ranks[rank].rank == rank:
            return self.ranks[rank]
        for view in self.ranks:
            if view.rank == rank:
                return view
        return None

    @property
    def elapsed_s(self) -> float | None:
        if self.run.started_t is None:
            return None
        return max(0.0, self.taken_t - self.run.started_t)

    @property
    def recovered(self) -> bool:
        """The run went on without a problem after an attempt that failed (model.attempts)."""
        return (
            self.attempts is not None
            and bool(self.attempts.ended)
            and not self.verdict.is_problem
            and self.verdict is not Verdict.RUNNING
        )

    @property
    def never_started(self) -> bool:
        """The run is over and no rank ever started (its doctor failed, torchrun ended first, a
        node never joined the rendezvous)."""
        if self.verdict is Verdict.NOT_STARTED:
            return True
        return bool(self.nodes_missing) and not self.live and self.verdict is Verdict.RUNNING

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
            "nodes_missing": list(self.nodes_missing),
            "launchers": [launcher.to_json() for launcher in self.launchers],
            "run": {
                "name": self.run.name,
                "run_dir": self.run.run_dir,
                "world_size": self.run.world_size,
                "backend": self.run.backend,
                "hosts": list(self.run.hosts),
            },
            "taken_t": self.taken_t,
            "finished": self.finished,
            "live": self.live,
            "thresholds": self.thresholds.to_json() if self.thresholds else None,
            "waits": [w.to_json() for w in self.waits],
            "confirmed": self.confirmed,
            "flight_recorder": {str(d.rank): d.to_json() for d in self.flight_recorder},
            "attempts": None
            if self.attempts is None
            else self.attempts.to_json(recovered=self.recovered),
        }
