"""Monitor: watch one run directory — tail it, fold it into RunState, diagnose, write diagnosis.json.

`poll()` reads what is new, applies it and returns a diagnosed Snapshot; it never waits for py-spy
or the log explainers (they run in background threads and land in later snapshots). The same
Monitor serves a live run (launched here or attached with `watch`), a finished one and a directory
copied from another machine: when nothing of the run is alive any more, time stops at the run's
last event, so ages and waits read as they were when the record ended.

A job that spans nodes has one launcher per node writing into the same run directory
(RUN_DIR/nodes/node-<N>/node.json says which torchrun is whose). A Monitor built for node N's
launcher (`node_rank=N`) captures the stacks of that node's own ranks itself and asks the other
launchers for the rest; a Monitor of `ddpdoctor watch` captures the live ranks of its own host and
asks for the rest (ddpdoctor.protocol.stack_requests).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.follow.fr_collector import FrCollector
from ddpdoctor.monitor.follow.host_probes import GpuProbe, HostProbes, NvmlProbe
from ddpdoctor.monitor.follow.log_findings import LogFindings
from ddpdoctor.monitor.follow.vouching import RankSaid
from ddpdoctor.monitor.judge.diagnose import Diagnosis, apply_diagnosis, diagnose, keep_said
from ddpdoctor.monitor.judge.held import stop_file, stopped_by_peer
from ddpdoctor.monitor.judge.node_coverage import Coverage
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.judge.run_end import (
    ended_with_ranks,
    interrupted_snapshot,
    not_started_snapshot,
)
from ddpdoctor.monitor.judge.run_findings import (
    skipped_event_findings,
    unreadable_findings,
    world_findings,
)
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.monitor.pipeline.followed_run import FollowedRun
from ddpdoctor.monitor.pipeline.gc_pacing import fit_to_ranks
from ddpdoctor.monitor.pipeline.network_follow import NetworkFollow
from ddpdoctor.monitor.pipeline.seen import (
    across_nodes_of,
    await_nodes,
    check_disk,
    contradicted_findings,
    doubt_exits,
    look_vouched,
    undisputed,
    vouch,
)
from ddpdoctor.monitor.tell.diagnosis_file import DiagnosisWriter
from ddpdoctor.protocol import processes
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic
from ddpdoctor.stacks.collector import StackCollector

# A follower's ranks in one of these states: it pulls the other nodes' summaries.
_PULL_STATES = frozenset({RankState.WAITING, RankState.STALLED, RankState.FAILED, RankState.GONE})


def _asker(node_rank: int | None):
    from ddpdoctor.protocol.stack_requests import Asker

    if node_rank is None:
        return Asker.here(role="watch")
    return Asker.here(role="launcher", node=node_rank)


class Monitor(FollowedRun):
    """Watch one run: follow it (FollowedRun), judge each poll, write and tell its diagnosis."""

    def __init__(
        self,
        run_dir: RunDir | str | os.PathLike[str],
        *,
        hang_after: float | None = None,
        capture_stacks: bool = True,
        clock: Callable[[], float] = time.time,
        write_diagnosis: bool = True,
        stack_timeout_s: float = 10.0,
        explain_logs: bool = True,
        node_rank: int | None = None,
        ask_remote: bool = True,
        gpu_probe: GpuProbe | None = None,
        follow_all_nodes: bool = False,
        launcher: bool = False,
        rank_socket: RankSaid | None = None,
    ) -> None:
        """`node_rank`: this monitor serves node N's launcher of a job that spans nodes (its own
        ranks are those of its torchrun). `ask_remote`: ask other nodes' launchers for the stacks
        of ranks this process cannot reach. `gpu_probe`: the GPU utilization of local ranks that
        others wait on (NVML by default; ddpdoctor.monitor.follow.host_probes). `follow_all_nodes`: a
        follower launcher whose view someone looks at reads every node's summary all along, as
        node 0 does (NodeMerge), so that view shows every rank. `launcher`: this monitor is
        `ddpdoctor run`'s, on the job's own host: it looks at its ranks' network when they
        stall and at the names the launch needs (ddpdoctor.monitor.pipeline.network_follow).
        `rank_socket`: the launcher's socket its ranks say their rank to
        (ddpdoctor.protocol.rank_socket)."""
        super().__init__(
            run_dir,
            hang_after=hang_after,
            clock=clock,
            node_rank=node_rank,
            follow_all_nodes=follow_all_nodes,
            rank_socket=rank_socket,
        )
        self.capture_stacks = capture_stacks
        self.write_diagnosis = write_diagnosis
        data = self.run.read_run_json()
        self.stacks = StackCollector(
            self.run,
            timeout_s=stack_timeout_s,
            asker=_asker(node_rank) if ask_remote else None,
            clock=clock,
            launcher_ended=self._launcher_ended,
        )
        self.logs = LogFindings(self.run) if explain_logs else None
        # flight-recorder dumps asked of the ranks (a suspected hang or mismatch, the TUI's `b`)
        self.flight_recorder = FrCollector(self.run, clock=clock)
        self._lock = threading.RLock()
        self._previous = self._read_previous_diagnosis()
        self._first_problem: tuple[tuple[Verdict, float], float] | None = None
        self._captured_for: frozenset[int] | None = None
        self._loaded_stored_stacks = False
        # diagnosis.json, written when what it says changes
        self.writer = DiagnosisWriter(self.run, node_rank)
        self.polls = 0
        # The launcher's own diagnosis.json of an ended run is authoritative: a watcher never
        # writes over it (its verdict could only be the same or, from a partial read, worse).
        self._authoritative = bool(self._previous and self._previous.get("final") is True)
        # Set by the launcher when the user stopped the run: (whether, the verdict before).
        self._interrupted: tuple[bool, Verdict | None] = (False, None)
        # The launcher stopped the job for this outcome: it stays the verdict (diagnose's held).
        self._held: RuleOutcome | None = self._held_on_file(self._previous)
        self._said: dict[tuple[str, str], Finding] = {}  # findings that stay once found
        self._confirmed: dict[Verdict, RuleOutcome] = {}  # the latest confirmed outcome of each
        self._final = False
        # The launcher's exit status as whoever ran it saw it, and its name (close()).
        self._job_exit: tuple[int | None, str | None] = (None, None)
        self._killed_launcher: Any = None  # _launcher_killed's answer, once asked
        self._launcher_pid: int | None = None  # run.json's launcher_pid (0: none), once read
        self.host_probes = HostProbes(gpu_probe if gpu_probe is not None else NvmlProbe())
        # a launcher's looks at its ranks' connections once they all stall; every node's read
        self.network = NetworkFollow(self.run, node_rank, data, look=launcher)
        self._pending_since: dict[int, float] = {}  # rank -> when its node was first asked
        self.coverage = Coverage()  # a multi-node verdict held until every node covers it
        self._heard_at: dict[int, tuple[float, int]] = {}  # node -> (its change, polls then)

    # -- public API ------------------------------------------------------------------------

    def poll(self) -> Snapshot:
        """Read what is new, apply it, diagnose; never blocks on py-spy or the explainers."""
        with self._lock:
            return self._poll()

    def request_stacks(self) -> bool:
        """Capture py-spy stacks of every local rank now, in the background."""
        with self._lock:
            snap = self._last or self._poll()
            return self._start_capture(snap)

    def request_flight_recorder(self) -> bool:
        """Ask every rank for its flight-recorder dump now (answered within a heartbeat)."""
        with self._lock:
            return self.flight_recorder.ask()

    def wait_for_stacks(self, timeout_s: float | None = None) -> Snapshot:
        """Wait (bounded) for a capture in progress, then poll: for a launcher that wants the
        stacks of a hang before it stops the job."""
        self.stacks.wait(timeout_s if timeout_s is not None else self.stacks.timeout_s + 5.0)
        return self.poll()

    def hold_verdict(self, verdict: Verdict) -> None:
        """The launcher stops the job for `verdict`: from now on it is the verdict, with the
        culprits it was stopped for; what the ranks do after the stop is its consequence. A
        launcher that follows another node's stop holds what it saw of that verdict itself, or
        the bare verdict."""
        with self._lock:
            if self._held is not None:
                return
            outcome = self._confirmed.get(verdict) or stopped_by_peer(verdict)
            self._held = replace(outcome, stopped_t=time.time())
            record = stop_file(self._held)
            if record is not None and self.node_rank in (None, 0):
                try:  # the stop, on file before the ranks are stopped (judge/held.py)
                    write_json_atomic(self.run.stopped_json, record)
                except OSError:
                    pass  # (a full disk: diagnosis.json will say it, if it can)

    @property
    def held(self) -> Verdict | None:
        """The verdict the launcher stopped the job for, once it has."""
        return self._held.verdict if self._held is not None else None

    def close(
        self,
        *,
        job_ended: bool = False,
        interrupted: bool = False,
        verdict_before: Verdict | None = None,
        job_exit: int | None = None,
        launcher: str | None = None,
    ) -> Snapshot:
        """The final snapshot: everything read, captures finished, logs explained, and
        diagnosis.json written. `job_ended`: see `self.job_ended` (the launcher's diagnosis.json
        is then final: marked so, and authoritative for later watchers). `interrupted`: the user
        stopped the run; unless `verdict_before` (the verdict when they did) was a problem, the
        run is INTERRUPTED, not a crash of the ranks that were stopped."""
        with self._lock:
            self.job_ended = self.job_ended or job_ended
            self._final = self.job_ended
            self._interrupted = (interrupted, verdict_before)
            self._job_exit = (job_exit, launcher)
            if interrupted and verdict_before is not None and verdict_before.is_problem:
                # stopped by the user after a problem was found: that problem stays, as when
                # the launcher stops the job itself
                self._held = self._held or self._confirmed.get(verdict_before)
            if self._held is None and not self.job_ended:  # a watcher: the launcher may have
                self._held = self._held_on_file(self._read_previous_diagnosis())  # stopped it
            self._poll()
            if self.job_ended and not interrupted:
                await_nodes(self)
            self.stacks.wait(self.stacks.timeout_s + 5.0)
            if self.logs is not None and self.merge.active:
                # (a follower whose ranks never waited leaves the whole run's logs to node 0)
                self.logs.refresh_now()
            snap = self._poll(final=True)
            self._write(snap, force=True)
            return snap

    @property
    def write_error(self) -> str | None:
        """Why diagnosis.json could not be written, once it could not (said, never raised)."""
        return self.writer.error

    @property
    def writes_diagnosis(self) -> bool:
        """Whether this monitor writes diagnosis.json (not over a launcher's final one)."""
        return self.write_diagnosis and not (self._authoritative and not self.job_ended)

    @property
    def last(self) -> Snapshot | None:
        return self._last

    # -- one poll --------------------------------------------------------------------------

    def _poll(self, *, final: bool = False) -> Snapshot:
        now = self.clock()
        self.polls += 1
        self._reload_run_json()
        self._read_nodes(now)
        checkup = self._read_checkup(now, final)
        # Liveness before reading: an exit event written before a process died is read in the
        # same poll that sees it dead, so a clean exit never flickers as "gone".
        self._check_liveness()
        if final and self.node_rank in (None, 0):
            self.tailer.log_roots = None  # the final word (node 0, a watcher): every log, once
        self.merge.merge(now, self.nodes, final=final)  # before reading: a resumed file too
        fit_to_ranks(len(self.state.ranks))
        batch = self.tailer.poll(now, drain=final or self.polls == 1)
        apply, note = self.state.apply, self.merge.note
        for lines in batch.events:
            for line_no, raw in lines.lines:
                event = parse_event_line(raw)
                if event is not None:
                    apply(event, (lines.rel, line_no))
                    note(event["rank"], line_no, event)
        self._check_liveness(first_look=True)
        vouch(self)
        doubt_exits(self)
        self.merge.publish(now, force=final)
        self.host_probes.probe(self.state, self._last, now)
        interesting = False
        for log in batch.logs:
            if self.state.apply_log_lines(log.source, log.lines):
                interesting = True
        live = self._is_live(now)
        if live or self.job_ended:  # a run read later: today's free space says nothing of it
            check_disk(self, now, final)
        taken = now if live else (self.state.last_t or now)
        snap = self.state.snapshot(taken, live=live, hang_after=self.hang_after)
        if self.logs is not None:
            self.logs.note_lines(interesting)
            self.logs.collect()
            if not final:
                self.logs.maybe_start(now)
        self.stacks.collect()
        if not live and not self._loaded_stored_stacks and not self.stacks.groups:
            self._loaded_stored_stacks = True
            self.stacks.load_latest()
        snap = replace(
            snap,
            stacks=self.stacks.groups,
            stack_status=self.stacks.status,
            flight_recorder=self.flight_recorder.collect(now),
            fr_status=self.flight_recorder.status(),
            checkup=checkup,
        )
        # a job on one node takes no network look (a node's look is for a job over several):
        # a network.json there is none of ddpdoctor's
        multi = len(self.nodes) > 1 or (snap.run.nnodes or 1) > 1
        nodes = set(self.nodes) | set(range(min(snap.run.nnodes or 1, 4096))) if multi else set()
        vouched = functools.partial(look_vouched, self) if live else None
        snap = replace(snap, network=self.network.read(snap, nodes, now, vouched))
        extra = list(self.stacks.findings)
        if self.logs is not None:
            extra.extend(self.logs.findings)
        extra.extend(unreadable_findings(self.tailer.unreadable))
        extra.extend(skipped_event_findings(self.state))
        extra.extend(world_findings(self.state))
        extra.extend(contradicted_findings(self.state))
        extra.extend(self.vouching.findings(self.state.world_size))
        extra.extend(self.disk.findings())
        extra.extend(self.network.findings(snap))
        if live:
            extra.extend(self.merge.findings(now, self.nodes))
        diagnosis = keep_said(diagnose(snap, extra_findings=extra, held=self._held), self._said)
        diagnosis = undisputed(diagnosis, self.merge)
        primary = diagnosis.primary
        # (replicas that diverged are never confirmed, yet stopped on with --stop-on-divergence)
        if primary is not None and (diagnosis.confirmed or primary.rule == "replicas"):
            self._confirmed[diagnosis.verdict] = primary
        snap = apply_diagnosis(snap, diagnosis, detected_after_s=self._timing(diagnosis, now, live))
        snap = self._ended_verdict(snap, live)
        if len(self.nodes) > 1:
            if snap.verdict.is_problem:  # has another node's part ended? (its record, now)
                self.node_watch.due_now()
                self._read_nodes(now)
            snap = across_nodes_of(self, snap, now, final=final)
        if (
            self.capture_stacks
            and snap.verdict is Verdict.HANG
            and self._captured_for != snap.culprits
            and live
            and self._held is None  # stopped: its stacks were taken before, the ranks are ending
        ) and self._start_capture(snap):
            self._captured_for = snap.culprits
            snap = replace(snap, stack_status=self.stacks.status)
        if not final:
            self.flight_recorder.maybe_ask(snap, now)
            if not self.merge.active:  # a follower sees the other nodes once its ranks wait
                self.merge.observe(
                    any(
                        v.state in _PULL_STATES and self.state.node_of(v.rank) == self.node_rank
                        for v in snap.ranks
                    )
                )
        if not final and live and self._held is None:
            self.network.observe(snap, self.own_ranks(snap), now)
        self._last = snap
        self._write(snap)
        return snap

    def _ended_verdict(self, snap: Snapshot, live: bool) -> Snapshot:
        """The verdicts only an ended run gets (ddpdoctor.monitor.judge.run_end)."""
        interrupted, before = self._interrupted
        if interrupted and not (before is not None and before.is_problem):
            return interrupted_snapshot(snap)
        if self.state.last_t is not None:
            if interrupted:  # after a problem was found: it stands (held, or as diagnosed)
                return snap
            if self._held is None and (self.job_ended or not live or snap.finished):
                code, launcher = self._job_exit
                # a watcher, once every rank has ended: did `ddpdoctor run` itself get killed?
                killed = None if self.job_ended or not snap.finished else self._launcher_killed()
                snap = ended_with_ranks(snap, code, launcher, killed)
            return snap
        if live or snap.verdict is not Verdict.RUNNING:
            return snap
        return not_started_snapshot(snap, self.run, self.tailer.events_dir_error)

    def _launcher_killed(self) -> tuple[int, dict[str, Any] | None] | None:
        """(its pid, the last diagnosis it wrote) when the `ddpdoctor run` that launched this
        run died while its job ran (its reaper then ended the job and left
        RUN_DIR/launcher-killed.json) and wrote no final diagnosis
        (ddpdoctor.monitor.judge.run_end.launcher_killed_snapshot)."""
        if self._killed_launcher is None:
            previous = self._read_previous_diagnosis()
            pid = self.run.read_run_json().get("launcher_pid")
            # its reaper says so (a diagnosis.json deleted from a copy must not read as this)
            killed = processes.launcher_was_killed(self.run.path) and not (
                previous and previous.get("final") is True
            )
            self._killed_launcher = (pid, previous) if killed else False
        return self._killed_launcher or None

    def _timing(self, diagnosis: Diagnosis, now: float, live: bool) -> float | None:
        """detected_after_s: problem start -> the poll that first reached the verdict (live), or
        -> the moment the verdict's condition held (post-mortem)."""
        if not diagnosis.verdict.is_problem:
            return None
        if not live:
            previous = self._previous
            if previous and previous.get("verdict") == diagnosis.verdict.value:
                recorded = previous.get("detected_after_s")
                if isinstance(recorded, (int, float)):
                    return float(recorded)
            return diagnosis.detected_after_s
        if diagnosis.started_t is None:
            return None
        # The same problem (verdict and start) keeps the time it was first seen, even if a
        # poll in between missed it (a heartbeat late on a loaded machine).
        key = (diagnosis.verdict, round(diagnosis.started_t, 1))
        if self._first_problem is None or self._first_problem[0] != key:
            self._first_problem = (key, now)
        return max(0.0, self._first_problem[1] - diagnosis.started_t)

    def _start_capture(self, snap: Snapshot) -> bool:
        targets = self.own_ranks(snap)
        remote = {
            v.rank: self.state.node_of(v.rank)
            for v in snap.ranks
            if v.rank not in targets
            and v.pid is not None
            and not v.state.finished
            and v.alive is not False
        }
        return self.stacks.start(targets, remote=remote)

    def _write(self, snap: Snapshot, *, force: bool = False) -> None:
        if self.writes_diagnosis:
            self.writer.write(
                snap,
                force=force,
                final=self._final,
                held=self._held,
                previous=self._read_previous_diagnosis,
            )
