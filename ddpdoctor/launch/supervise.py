"""Supervision of a live job: what the launcher does when the monitor's verdict turns bad.

The same policy serves the TUI and the headless view: `SupervisedRun` wraps the Monitor, and each
poll applies the policy, so whichever view polls, a hang stops the job (after its py-spy stacks are
in) unless the user asked to keep it running.

The launcher stops a job only on a certain verdict (`Snapshot.confirmed`): a mismatch deadlock, a
crash torchrun did not end, or a hang whose culprit is confirmed blocked by two heartbeat
intervals (no CPU advance, no I/O, the same frame), silent (its heartbeat stopped) or finished.
Those verdicts rest on what ddpdoctor observed (the ranks' events, the process table): text the
job printed never ends a rank or confirms a verdict (ddpdoctor.protocol.trust).
Never for a busy rank: ranks waiting for one are a wait (a `running` verdict with a
`wait.busy_rank` finding), even when the wait becomes an error near the process group's timeout,
since torch's own timeout ends it then. A hang without a culprit (every rank in the same
collective: the transport) is reported, not stopped.

    hang      stop as soon as the stacks are captured (at most STACK_WAIT_S after the verdict)
    mismatch  on gloo a mismatch usually aborts by itself: give torchrun a moment to tear the job
              down, then stop it like a hang (a barrier facing an all_reduce blocks instead)
    crash     torchrun stops the surviving ranks itself; stop the job only if that takes too long

A job that spans nodes has one launcher per node, each supervising its own torchrun. Node 0's
launcher leads: it stops its job by the rules above. The others follow: each stops its own
torchrun as soon as another node's launcher has stopped its job (its node record says so), so no
node's ranks are left behind, and by the rules above only after FOLLOWER_GRACE_S more (in case the
lead is gone). Every launcher answers the stack requests of the others while its job runs, and
finishes an answer in progress before it stops its ranks.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from ddpdoctor.protocol.verdicts import Verdict

if TYPE_CHECKING:  # pragma: no cover - the monitor's snapshots, read by attribute only
    from ddpdoctor.monitor.model.snapshot import Snapshot

STACK_WAIT_S = 20.0  # remote stacks answer within the request timeout (py-spy 10 s + polling)
FOLLOWER_GRACE_S = 10.0
ASK_STACKS_AFTER_S = 2.0  # the monitor captures on a hang itself; ask only if it has not begun


@dataclass(frozen=True)
class StopRule:
    min_wait_s: float  # let the job end by itself for at least this long after the verdict
    max_wait_s: float  # stop it at the latest this long after the verdict


STOP_RULES: dict[Verdict, StopRule] = {
    Verdict.HANG: StopRule(0.0, STACK_WAIT_S),
    Verdict.MISMATCH: StopRule(3.0, STACK_WAIT_S),
    Verdict.CRASH: StopRule(15.0, 15.0),
}


def stacks_settled(snapshot: Snapshot) -> bool:
    """The monitor's stack capture is done (other nodes' answers included), or cannot happen
    ("py-spy missing", ...)."""
    status = (snapshot.stack_status or "").strip().lower()
    if status.startswith("capturing"):
        return False
    return bool(snapshot.stacks) or bool(status)


@dataclass(frozen=True)
class Decision:
    stop: Verdict | None = None  # stop the job now, for this verdict
    capture_stacks: bool = False  # ask the monitor for stacks first


def diverged(snapshot: Snapshot) -> bool:
    """The verdict is the replicas' divergence, or a ZeRO optimizer's ranks that updated it
    differently (monitor/judge/rules/replicas.py, replica_updates.py)."""
    findings: Any = getattr(snapshot, "findings", ())
    return bool(
        snapshot.verdict is Verdict.MISMATCH
        and findings
        and findings[0].id in ("replicas.diverged", "replicas.updates_differ")
    )


class StopPolicy:
    """Decides, one snapshot at a time, whether the launcher should stop the job now."""

    def __init__(
        self,
        *,
        keep_running: bool,
        clock: Callable[[], float] = time.monotonic,
        follower: bool = False,
        stop_on_divergence: bool = False,
    ):
        self.keep_running = keep_running
        self.follower = follower  # a launcher of node > 0: it follows the lead's stop
        # replicas that diverged are a mismatch never confirmed (the job does not hang): the
        # user's --stop-on-divergence makes it one to stop on
        self.stop_on_divergence = stop_on_divergence
        self._clock = clock
        self._verdict: Verdict | None = None
        self._since: float | None = None
        self._asked_stacks = False
        self.stopped_for: Verdict | None = None

    def observe(
        self, snapshot: Snapshot, *, job_running: bool, peer_stopped: Verdict | None = None
    ) -> Decision:
        """`peer_stopped`: another node's launcher stopped its part of the job for this verdict."""
        if not job_running or self.stopped_for is not None:
            return Decision()
        if peer_stopped is not None and not self.keep_running:
            self.stopped_for = peer_stopped
            return Decision(stop=peer_stopped)
        verdict = snapshot.verdict
        confirmed = getattr(snapshot, "confirmed", False) or (
            self.stop_on_divergence and diverged(snapshot)
        )
        rule = STOP_RULES.get(verdict) if confirmed else None
        if rule is None:
            self._verdict = self._since = None
            return Decision()
        now = self._clock()
        if verdict != self._verdict or self._since is None:
            self._verdict, self._since = verdict, now
        if self.keep_running:
            return Decision()
        waited = now - self._since
        settled = stacks_settled(snapshot)
        if self.follower:
            if waited >= rule.max_wait_s + FOLLOWER_GRACE_S:
                self.stopped_for = verdict
                return Decision(stop=verdict)
        elif waited >= rule.max_wait_s or (waited >= rule.min_wait_s and settled):
            self.stopped_for = verdict
            return Decision(stop=verdict)
        # The monitor captures stacks on a hang by itself; for a job that still runs after
        # any other bad verdict, ask for them so the stop does not wait for nothing.
        if (
            waited >= max(rule.min_wait_s, ASK_STACKS_AFTER_S)
            and not settled
            and not snapshot.stack_status
            and not self._asked_stacks
        ):
            self._asked_stacks = True
            return Decision(capture_stacks=True)
        return Decision()


def peer_stop(records: Any, node_rank: int | None, snapshot: Any = None) -> Verdict | None:
    """The verdict another node's launcher stopped its torchrun for (node records), if any,
    once what this launcher sees confirms it (`peer_record_confirmed`)."""
    if node_rank is None:
        return None
    for node, record in sorted((records or {}).items()):
        if node != node_rank and record.stopped_for and peer_record_confirmed(record, snapshot):
            try:
                return Verdict(record.stopped_for)
            except ValueError:
                continue
    return None


def peer_never_started(records: Any, node_rank: int | None) -> Any:
    """Another node's record of a launcher that ended without starting its torchrun (its doctor
    failed, or it was refused): the rendezvous can never complete, so waiting is pointless."""
    if node_rank is None:
        return None
    for node, record in sorted((records or {}).items()):
        if (
            node != node_rank
            and record.ended
            and record.started_t is None
            and not (is_local(record.host) and pid_alive(record.launcher_pid))
        ):
            return record  # (a launcher of this host that still runs has not ended)
    return None


def is_local(host: str | None) -> bool:
    here = socket.gethostname()
    return bool(host) and (host == here or str(host).split(".")[0] == here.split(".")[0])


def pid_alive(pid: int | None) -> bool:
    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False


def peer_record_confirmed(record: Any, snapshot: Any) -> bool:
    """Whether a node record's word that its launcher stopped its part of the job is borne out
    by what this launcher sees: a node record is a file of the run directory, which any process
    of the job can write. On this host, that node's torchrun has ended; on another, a rank of
    that host has ended (a stopped part's ranks end within a second or two)."""
    if is_local(record.host):
        return not (record.torchrun_pid and pid_alive(record.torchrun_pid))
    views = [v for v in getattr(snapshot, "ranks", ()) if v.host == record.host]
    return not views or any(v.state.finished for v in views)


def local_rank_pids(snapshot: Snapshot) -> list[int]:
    """Pids of the ranks running on this host, alive right now (the monitor checks local pids;
    pids of other hosts, or of ranks long gone whose pid may have been reused, mean nothing)."""
    return [r.pid for r in snapshot.ranks if r.pid and r.alive is True and not r.state.finished]


class SupervisedRun:
    """The Monitor as the views see it (`poll`, `request_stacks`), with the launcher's policy
    applied on every poll. `poll` may run on a TUI worker thread."""

    def __init__(
        self,
        monitor: Any,
        job: Any,
        policy: StopPolicy,
        *,
        on_stop: Callable[[Verdict], None] | None = None,
        responder: Any = None,
    ) -> None:
        self.monitor = monitor
        self.job = job
        self.policy = policy
        self._on_stop = on_stop
        self.responder = responder  # ddpdoctor.stacks.responder.StackResponder (several nodes)
        self.node_rank: int | None = getattr(monitor, "node_rank", None)
        self._stop_pending = False
        self.last: Snapshot | None = None
        # The node whose launcher ended before starting its part: this node stopped waiting.
        self.abandoned_by: int | None = None

    def poll(self) -> Snapshot:
        if self.job.returncode() is not None:
            self.monitor.job_ended = True
        snapshot = self.monitor.poll()
        self.last = snapshot
        self.job.refresh()
        if self.node_rank is None:
            self.job.track(local_rank_pids(snapshot))
        else:  # other nodes' ranks may share this host: only this node's are the job's
            self.job.track(self.monitor.own_ranks(snapshot).values())
        running = self.job.returncode() is None
        if self.responder is not None and running:
            self.responder.poll(self.monitor.node_ranks(snapshot))
        nodes = getattr(self.monitor, "nodes", None)
        absent = peer_never_started(nodes, self.node_rank)
        if absent is not None and running and self.abandoned_by is None:
            # Without this, torchrun waits for the missing node until its rendezvous times out.
            self.abandoned_by = absent.node_rank
            self._stop_pending = True
        peer = peer_stop(nodes, self.node_rank, snapshot)
        decision = self.policy.observe(snapshot, job_running=running, peer_stopped=peer)
        if decision.capture_stacks:
            self.monitor.request_stacks()
        if decision.stop is not None:
            # The verdict the job is stopped for stays its verdict, whatever the ranks do as
            # they are stopped (ddpdoctor.monitor.judge.diagnose).
            hold = getattr(self.monitor, "hold_verdict", None)
            if hold is not None:
                hold(decision.stop)
            if self._on_stop is not None:
                self._on_stop(decision.stop)
            self._stop_pending = True
        if self._stop_pending and not (self.responder is not None and self.responder.busy):
            # An answer in progress is finished first: another node waits for these stacks.
            self._stop_pending = False
            self.job.stop()
        return snapshot

    def request_stacks(self) -> None:
        self.monitor.request_stacks()

    def request_flight_recorder(self) -> bool:
        return bool(self.monitor.request_flight_recorder())

    @property
    def stopped_for(self) -> Verdict | None:
        return self.policy.stopped_for
