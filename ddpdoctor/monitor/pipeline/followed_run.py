"""What a Monitor follows, before it judges: the run directory tailed and folded into RunState,
run.json as it changes, the launchers' node records and the other nodes' summaries, which
local ranks' processes live, the disk the events go to, which ranks ddpdoctor can vouch for,
and the preflight's script checkup. The Monitor (ddpdoctor.monitor.pipeline.live) is this,
plus the judging and telling of each poll."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpdoctor.monitor.follow.checkup import CheckupReader
from ddpdoctor.monitor.follow.disk_space import DiskWatch
from ddpdoctor.monitor.follow.liveness import is_local, pid_alive, this_host
from ddpdoctor.monitor.follow.node_summaries import NodeMerge
from ddpdoctor.monitor.follow.node_watch import NODES_EVERY_S, NodeWatch
from ddpdoctor.monitor.follow.runinfo import recorded_hang_after, run_info, with_nodes
from ddpdoctor.monitor.follow.tail import RunTailer
from ddpdoctor.monitor.follow.vouching import RankSaid, Vouching
from ddpdoctor.monitor.judge.held import held_by_launcher, held_by_stop_file
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.judge.run_end import launcher_gone
from ddpdoctor.monitor.model.launchers import current_argv
from ddpdoctor.monitor.model.snapshot import CheckupNote, RankView, Snapshot
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.rundir import RunDir

# With no local rank alive, a run whose latest event is older than this is over (or elsewhere).
LIVE_WINDOW_S = 30.0


def _classifier() -> Callable[[str], Any] | None:
    try:
        from ddpdoctor.explain import classify_line
    except ImportError:
        return None
    return classify_line


class FollowedRun:
    """The run as followed: its files read, its ranks' records folded, its processes seen."""

    def __init__(
        self,
        run_dir: RunDir | str | os.PathLike[str],
        *,
        hang_after: float | None,
        clock: Callable[[], float],
        node_rank: int | None,
        follow_all_nodes: bool,
        rank_socket: RankSaid | None = None,
    ) -> None:
        self.run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
        self.node_rank = node_rank
        self.clock = clock
        data = self.run.read_run_json()
        self.hang_after = hang_after if hang_after is not None else recorded_hang_after(data)
        self.state = RunState(run_info(self.run, data), classify=_classifier())
        self.tailer = RunTailer(self.run)
        if node_rank is not None:  # a launcher of a job over several nodes: its own logs
            self.tailer.log_roots = (self.run.node_logs_dir(node_rank),)
        # other nodes' summaries in place of their ranks' files; this node's own summary
        self.merge = NodeMerge(
            self.run, self.state, self.tailer, node_rank, follow_all=follow_all_nodes
        )
        self.nodes: dict[int, NodeRecord] = {}
        self.node_watch = NodeWatch(self.run)
        # Set by whoever runs the job (the launcher) once torchrun has exited: a run that never
        # wrote a thing is then over, not starting.
        self.job_ended = False
        self._checkup_read_t: float | None = None
        self.disk = DiskWatch(self.run.path)
        # the preflight's script checkup findings (doctor.json), which diagnoses cite
        self.checkup = CheckupReader(self.run)
        self.local_host = this_host()
        self._local_hosts: dict[str | None, bool] = {}  # host -> whether it is this one
        self._run_json_mtime = self._mtime(self.run.run_json)
        # which ranks are processes of the job (a file's word alone makes no rank)
        self.vouching = Vouching(self.run.path, self.run.events_file, rank_socket)
        self._last: Snapshot | None = None

    def owns(self, view: RankView) -> bool:
        """Whether this process captures the rank itself: a launcher the ranks of its own node
        (not merely of its host: two agents may share one); a watcher the live ranks of its host
        that no running launcher answers for."""
        if view.alive is not True or view.pid is None or view.state.finished:
            return False
        node = self.state.node_of(view.rank)
        if self.node_rank is not None:
            return node == self.node_rank
        # A watcher leaves a rank to its node's launcher while that one runs: py-spy attaches to
        # a process one tracer at a time, and the launcher is there to capture it.
        record = self.nodes.get(node) if node is not None else None
        return record is None or record.ended

    def own_ranks(self, snap: Snapshot | None = None) -> dict[int, int]:
        """rank -> pid of the live ranks this process captures itself (see `owns`)."""
        snap = snap or self._last
        if snap is None:
            return {}
        return {v.rank: v.pid for v in snap.ranks if v.pid is not None and self.owns(v)}

    def node_ranks(self, snap: Snapshot | None = None) -> dict[int, int | None]:
        """For node N's launcher: every rank of node N, rank -> pid (None once it has ended)."""
        snap = snap or self._last
        if snap is None or self.node_rank is None:
            return {}
        return {
            v.rank: v.pid if self.owns(v) else None
            for v in snap.ranks
            if self.state.node_of(v.rank) == self.node_rank
        }

    # -- reading the run ---------------------------------------------------------------------

    def _check_liveness(self, *, first_look: bool = False) -> None:
        """Whether each local rank's process lives. `first_look`: only ranks seen for the first
        time in this poll, and a dead one reads as unknown until the next poll checks it before
        reading (its exit event may have been written after this poll read the file)."""
        alive = self.state.alive
        local = self._local_hosts
        for rank, tracker in self.state.ranks.items():
            if tracker.exit_code is not None or tracker.pid is None:
                continue
            here = local.get(tracker.host)
            if here is None:  # (one answer per host: this runs per rank, twice a poll)
                here = local[tracker.host] = is_local(tracker.host, self.local_host)
            if first_look:
                if here and rank not in alive:
                    self.state.set_alive(rank, pid_alive(tracker.pid, tracker.hello_t) or None)
                continue
            if alive.get(rank) is False:
                continue  # dead stays dead (a pid can be reused)
            if not here:
                alive[rank] = None  # another host's process: not this watcher's to tell
                continue
            self.state.set_alive(rank, pid_alive(tracker.pid, tracker.hello_t))

    def _is_live(self, now: float) -> bool:
        if self.job_ended and self.state.attempts.max_restarts:
            return False  # its launcher has ended: no attempt follows, a failure now is final
        if any(a is True for a in self.state.alive.values()):
            return True
        last = self.state.last_t
        if last is None:
            # Nothing written yet: the job is starting, unless it is known to be over (every
            # launcher of a job over several nodes has recorded its end).
            over = bool(self.nodes) and all(record.ended for record in self.nodes.values())
            if not self.nodes and not self.job_ended:
                over = launcher_gone(self.run, self.local_host)
            return not (self.job_ended or over)
        return now - last < LIVE_WINDOW_S or self._restarting()

    def _restarting(self) -> bool:
        """A job with a restart budget whose ranks' launcher (a local torchrun) still runs: it may
        be starting the next attempt (new processes import torch for a while before they say
        hello), so the run is live though no rank writes (docs/recovery.md)."""
        if not self.state.attempts.max_restarts or self.job_ended:
            return False
        launchers = {
            (t.ppid, t.parent_argv)
            for t in self.state.ranks.values()
            if t.ppid is not None and t.parent_argv and is_local(t.host, self.local_host)
        }  # (one look per launcher, not per rank)
        return any(current_argv(pid) == argv for pid, argv in launchers)

    def _reload_run_json(self) -> None:
        mtime = self._mtime(self.run.run_json)
        if mtime != self._run_json_mtime:
            self._run_json_mtime = mtime
            data = self.run.read_run_json()
            self.state.info = with_nodes(run_info(self.run, data), self.nodes)
            if self.hang_after is None:
                self.hang_after = recorded_hang_after(data)

    def _read_nodes(self, now: float) -> None:
        """The launchers' node records (a job that spans nodes), at most once a second."""
        quiet = bool(self.node_rank and self.state.ranks and not self.merge.active)
        records = self.node_watch.refresh(
            now, quiet_follower=quiet, expected=self.state.info.nnodes
        )
        if records is not None:
            self.nodes = records
            self.state.set_nodes(records)
            self.state.info = with_nodes(self.state.info, records)

    def _read_checkup(self, now: float, final: bool) -> tuple[CheckupNote, ...]:
        """The script checkup's findings: each doctor.json is read once as it appears (a watcher
        may attach before the preflight wrote it); looked for at most once a second."""
        last = self._checkup_read_t
        if final or last is None or not 0 <= now - last < NODES_EVERY_S:
            self._checkup_read_t = now
            return self.checkup.refresh()
        return self.checkup.notes

    def _launcher_ended(self, node: int) -> bool:
        record = self.nodes.get(node)
        return record is not None and record.ended

    @staticmethod
    def _mtime(path: Path) -> float | None:
        try:
            return path.stat().st_mtime
        except OSError:
            return None

    def _read_previous_diagnosis(self) -> dict[str, Any] | None:
        return self._read_json(self.run.diagnosis_json)

    def _held_on_file(self, previous: dict[str, Any] | None) -> RuleOutcome | None:
        """What the launcher stopped the job for, as its final diagnosis.json says, else as its
        stop record (stopped.json: written at the stop, so there without the final word)."""
        return held_by_launcher(previous) or held_by_stop_file(
            self._read_json(self.run.stopped_json)
        )

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = jsontext.read(path)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
