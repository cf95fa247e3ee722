"""RunState: every event and log line of a run folded into per-rank state; `snapshot(now)` freezes it.

`apply(event)` takes one event of any rank (in file order per rank); `apply_log_lines()` takes new
lines of a log file. `snapshot(now)` builds the frozen Snapshot the rules, the TUI and the text
view share: per rank its state, progress, timings, the collective in progress and whom it waits on
(each rank's view: ddpdoctor.monitor.model.rank_views; what the views say together:
ddpdoctor.monitor.model.views_together).
The diagnosis (verdict, findings, culprits) is added by ddpdoctor.monitor.judge.diagnose.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ddpdoctor.monitor.model import launchers
from ddpdoctor.monitor.model.attempts import AttemptLog
from ddpdoctor.monitor.model.event_fields import num
from ddpdoctor.monitor.model.launchers import LauncherGroups, launcher_groups, launcher_views
from ddpdoctor.monitor.model.pairings import PairingLog
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.rank_views import RankViews
from ddpdoctor.monitor.model.replica_groups import ReplicaLog
from ddpdoctor.monitor.model.snapshot import (
    LogLine,
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    Thresholds,
    Verdict,
)
from ddpdoctor.monitor.model.thresholds import compute_thresholds
from ddpdoctor.monitor.model.views_together import fill_waiting_on, settle_post_mortem
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.replica_groups import TORCHFT
from ddpdoctor.protocol.torchrun_logs import (
    AGENT_LOG,
    NCCL_LOG,
    RANK_LOG,
    AgentLogParser,
    LogSource,
)

LOG_RING = 1000  # recent log lines kept for the logs panel
# torchrun --tee copies every rank line into its own output as "[default3]:...": already read
# from the rank's own log file, so not shown twice.
_TEE_PREFIX = "[default"
_CLASSIFIED_LEVELS = ("error", "warn")

_NUMBER = (float, int)

Classifier = Callable[[str], Any]  # text -> LineClass(level, finding_id) | None


class RunState(RankViews):
    def __init__(self, info: RunInfo, *, classify: Classifier | None = None) -> None:
        self.info = info
        self.classify = classify
        self.ranks: dict[int, RankTracker] = {}
        self.alive: dict[int, bool | None] = {}
        self.step_times: deque[float] = deque(maxlen=256)
        self.waits: deque[tuple[float, float]] = deque(maxlen=1024)  # (start t, duration)
        self.training_start_t: float | None = None
        self.last_t: float | None = None  # latest event time of the whole run
        self.logs: deque[LogLine] = deque(maxlen=LOG_RING)
        self.by_local: dict[tuple[str, int], int] = {}  # (host, local_rank) -> rank
        self.by_pid: dict[tuple[str, int], int] = {}  # (host, pid) -> rank
        self.agents: dict[str, AgentLogParser] = {}  # by agent ("vm", or "vm node 1")
        self.agent_files: dict[str, str] = {}  # agent -> torchrun.log path (relative)
        self.nodes: dict[int, NodeRecord] = {}  # the launchers of a job that spans nodes
        self._by_node_local: dict[tuple[str, int, int], int] | None = None
        self._node_index: dict[tuple[str, int], int] = {}
        # rank -> (its tracker, the tracker's version, the view fields made from it)
        self._settled: dict[int, tuple[RankTracker, int, dict[str, Any]]] = {}
        # Ranks of other nodes whose record their node's latest row made (rank_rows): their
        # view is made once per row, and again only when their state changes in between.
        self.reported: set[int] = set()
        # The previous poll's views, when most stood (`_views`): until when they all may, under
        # which thresholds, the ranks whose record changed since, and the ranks not reported.
        self._last_views: list[RankView] | None = None
        self._last_key: tuple[Any, ...] = ()
        self._last_until = 0.0
        self._last_ref: tuple[float, ...] = (0.0, 0.0, 0.0)  # the largest thresholds since
        self._remake: set[int] = set()
        self._others: list[int] | None = None
        self._shared_items: tuple[dict[str, int] | None, tuple[tuple[str, int], ...]] = (None, ())
        self.events_applied = 0
        # the ranks grouped by the process that started them: made again after a hello only
        self._launcher_groups: LauncherGroups | None = None
        self._grouped_ranks = 0
        self.hello_world = 0  # the largest world size a hello event stated (bounded)
        # events whose rank lies outside the world: how many, and the first (file, line, rank)
        self.skipped_events = 0
        self.first_skipped: tuple[str, int, int] | None = None
        # ranks refused (no process of the job behind them) -> the pid of their refused hello:
        # their events are not folded in until a hello of another process
        self.refused: dict[int, int | None] = {}
        self.refused_events = 0
        # why the ranks' events cannot be written now (the run directory's file system full or
        # read-only), when ddpdoctor saw so: their records then end short of their processes
        self.events_lost: str | None = None
        # the run's attempts (a launcher's restarts): fed every hello (model.attempts)
        self.attempts = AttemptLog(info.command)
        self.replicas = ReplicaLog()  # torchft's replica groups, quorums and heals
        self.pairings = PairingLog()  # calls paired by chance, compared as they are read

    # -- input -----------------------------------------------------------------------------

    def tracker(self, rank: int) -> RankTracker:
        tracker = self.ranks.get(rank)
        if tracker is None:
            tracker = self.ranks[rank] = RankTracker(rank)
        return tracker

    def restart_rank(self, rank: int) -> None:
        """Forget a rank's events, to read them all again (what its logs said is kept)."""
        old = self.ranks.pop(rank, None)
        if rank in self.reported:
            self.reported.discard(rank)
            self._others = None
        self._remake.add(rank)
        self.pairings.restart()
        if old is not None:
            fresh = self.tracker(rank)
            fresh.error_lines = old.error_lines
            fresh.agent_exit_code = old.agent_exit_code
            self._by_node_local = None
            self._launcher_groups = None

    def apply(self, event: dict[str, Any], where: tuple[str, int] | None = None) -> None:
        """Fold one event in (events of one rank must come in file order)."""
        rank = event["rank"]
        if rank < 0:
            return
        if rank >= self._rank_bound(event):
            self.skipped_events += 1
            if self.first_skipped is None:
                self.first_skipped = (*(where or ("events", 0)), rank)
            return
        if rank in self.refused and not self._new_process(rank, event):
            self.refused_events += 1
            return
        if rank in self.reported:  # (a record made from rows never takes events on top)
            self.restart_rank(rank)
        if event["kind"] == ev.HELLO:  # before the tracker takes it: a new process ends the old
            old = self.ranks.get(rank)
            agent = self.agent_exit(old) if old is not None else None
            if self.attempts.hello(event, old, agent, self.alive.get(rank)):
                self.alive.pop(rank, None)  # the new process's liveness is looked at anew
                self._remake.add(rank)
                self.pairings.restart()
        kind = event["kind"]
        if kind == ev.HELLO:  # the replica group, and how an earlier process of the rank ended
            self.replicas.on_hello(event, self.attempts.last_ending)
        tracker = self.tracker(rank)
        tracker.apply(event, where)
        self.events_applied += 1
        t = num(event.get("t"))
        if t is not None and (self.last_t is None or t > self.last_t):
            self.last_t = t
        if kind == ev.STEP:
            if tracker.step_time_s is not None:
                self.step_times.append(tracker.step_time_s)
            self._training_started(t)
        elif kind == ev.PHASE and event.get("phase") == "train":
            self._training_started(t)
        elif kind == ev.COLLECTIVE_START and tracker.recent:
            self.pairings.on_call(rank, tracker.recent[-1], tracker.world_size)
        elif kind == ev.COLLECTIVE_END and event.get("ok", True) is not False:
            duration = num(event.get("duration_s"))
            if duration is not None and t is not None:
                self.waits.append((t - duration, duration))
        elif kind == ev.RAY_CALL:
            self.attempts.ray_call(event)
        elif kind == TORCHFT:
            self.replicas.on_event(event, t)
        elif kind == ev.HELLO:
            self._by_node_local = None
            self._launcher_groups = None
            if tracker.host is not None and tracker.local_rank is not None:
                self.by_local[(tracker.host, tracker.local_rank)] = rank
            if tracker.host is not None and tracker.pid is not None:
                self.by_pid[(tracker.host, tracker.pid)] = rank

    def refuse(self, rank: int) -> None:
        """Drop a rank no process of the job is behind (ddpdoctor.monitor.follow.vouching):
        no view, no culprit, no world size of its saying."""
        tracker = self.ranks.pop(rank, None)
        self.refused[rank] = tracker.pid if tracker is not None else None
        self.pairings.forget(rank)
        self.alive.pop(rank, None)
        self.reported.discard(rank)
        self._others = None
        self._remake.add(rank)
        self._settled.pop(rank, None)
        self._by_node_local = None
        self._launcher_groups = None
        self.by_local = {k: r for k, r in self.by_local.items() if r != rank}
        self.by_pid = {k: r for k, r in self.by_pid.items() if r != rank}
        for other, kept in self.ranks.items():  # a refused hello may have named a kept pid
            if kept.host is not None and kept.pid is not None:
                self.by_pid.setdefault((kept.host, kept.pid), other)

    def _new_process(self, rank: int, event: dict[str, Any]) -> bool:
        """A hello of another process than the refused one: the rank is looked at anew."""
        pid = event.get("pid")
        if event["kind"] != ev.HELLO or not isinstance(pid, int) or pid == self.refused[rank]:
            return False
        del self.refused[rank]
        return True

    def row_applied(self, tracker: RankTracker, *, stepped: bool) -> None:
        """What `apply` notes of a rank's events, for a row copied onto its record (a rank of
        another node, ddpdoctor.monitor.follow.rank_rows): its step time once per row, not per step."""
        if tracker.rank not in self.reported:
            self.reported.add(tracker.rank)
            self._others = None
        self._remake.add(tracker.rank)
        t = tracker.last_event_t
        if t is not None and (self.last_t is None or t > self.last_t):
            self.last_t = t
        if stepped and tracker.step_time_s is not None:
            self.step_times.append(tracker.step_time_s)
        if tracker.step is not None or tracker.phase == "train":
            self._training_started(tracker.last_progress_t)

    def add_waits(self, waits: Any) -> None:
        """(start t, duration) pairs of finished collectives another node's summary carried."""
        for pair in waits if isinstance(waits, list) else ():
            if type(pair) is list and len(pair) == 2:
                start, duration = pair
                if type(start) in _NUMBER and type(duration) in _NUMBER and duration >= 0:
                    self.waits.append((start, duration))

    def _rank_bound(self, event: dict[str, Any]) -> int:
        """Ranks below this are believed: the world size run.json or a rank's hello states (a
        hello may state a larger one than known so far), never above ev.MAX_RANKS."""
        if event["kind"] == ev.HELLO:
            stated = event.get("world_size")
            if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
                self.hello_world = max(self.hello_world, min(stated, ev.MAX_RANKS))
        # The world ddpdoctor's own launch made (nproc x nnodes) is a fact: no hello enlarges it.
        # A user's command's world is known only from what its ranks say.
        known = self.info.world_size or self.hello_world
        return min(known, ev.MAX_RANKS) if known and known > 0 else ev.MAX_RANKS

    def _training_started(self, t: float | None) -> None:
        if t is not None and (self.training_start_t is None or t < self.training_start_t):
            self.training_start_t = t

    def apply_log_lines(self, source: LogSource, lines: Iterable[tuple[int, str]]) -> int:
        """New lines of one log file: into the ring (classified) and into the rank's error lines.
        Returns how many were warnings or errors (every line counts when nothing classifies)."""
        if source.kind == AGENT_LOG:
            parser = self.agents.setdefault(source.agent_key, AgentLogParser())
            self.agent_files[source.agent_key] = source.rel
        rank = self.rank_of(source)
        label = source.label(rank)
        notable = 0
        for line_no, text in lines:
            if source.kind == AGENT_LOG:
                parser.feed(text, line_no)
                if text.startswith(_TEE_PREFIX):
                    continue
            if not text.strip():
                continue
            level, finding_id = "info", None
            if self.classify is not None:
                found = self.classify(text)
                if found is not None:
                    level = getattr(found, "level", "info") or "info"
                    finding_id = getattr(found, "finding_id", None)
            line = LogLine(label, text, rank, level, source.rel, line_no, finding_id)
            self.logs.append(line)
            if level in _CLASSIFIED_LEVELS or self.classify is None:
                notable += 1
                if rank is not None and level in _CLASSIFIED_LEVELS:
                    self.tracker(rank).add_error_line(line)
                    self._remake.add(rank)
        return notable

    def rank_of(self, source: LogSource) -> int | None:
        """The global rank a log file belongs to (None for shared logs or while unknown)."""
        if source.kind == RANK_LOG and source.host is not None and source.local_rank is not None:
            if source.node is not None:  # agents may share the host: the node tells them apart
                return self._node_local_index().get((source.host, source.node, source.local_rank))
            rank = self.by_local.get((source.host, source.local_rank))
            if rank is None and (self.info.nnodes or 1) == 1 and len(self.agent_files) <= 1:
                rank = source.local_rank  # one node: torchrun numbers local ranks as global ones
            return rank
        if source.kind == NCCL_LOG and source.host is not None and source.pid is not None:
            return self.by_pid.get((source.host, source.pid))
        return None

    def set_nodes(self, records: dict[int, NodeRecord]) -> None:
        """The node records of the run's launchers (RUN_DIR/nodes/), as the monitor read them."""
        if records != self.nodes:
            self.nodes = dict(records)
            self._by_node_local = None
            # (host, torchrun pid) -> node: node_of runs per rank per poll, over many nodes
            self._node_index = {
                (r.host, r.torchrun_pid): n
                for n, r in sorted(records.items(), reverse=True)
                if r.torchrun_pid is not None
            }

    def node_of(self, rank: int) -> int | None:
        """The node (launcher) a rank runs under, when known (as protocol's node_of finds it)."""
        tracker = self.ranks.get(rank)
        if tracker is None:
            return None
        if tracker.host is not None and tracker.ppid is not None:
            found = self._node_index.get((tracker.host, tracker.ppid))
            if found is not None:
                return found
        return tracker.group_rank

    def _node_local_index(self) -> dict[tuple[str, int, int], int]:
        """(host, node, local_rank) -> rank, rebuilt after a hello or new node records."""
        if self._by_node_local is None:
            index: dict[tuple[str, int, int], int] = {}
            for rank, tracker in self.ranks.items():
                node = self.node_of(rank)
                if tracker.host is not None and node is not None and tracker.local_rank is not None:
                    index[(tracker.host, node, tracker.local_rank)] = rank
            self._by_node_local = index
        return self._by_node_local

    def set_events_lost(self, why: str | None) -> None:
        if why != self.events_lost:
            self.events_lost = why
            self._remake.update(self.ranks)
            self._last_views = None

    def set_alive(self, rank: int, alive: bool | None) -> None:
        if self.alive.get(rank, alive) != alive or rank not in self.alive:
            self._remake.add(rank)
        self.alive[rank] = alive

    # -- derived ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The job's world: the launch's (run.json), checked against the ranks' own hellos.

        A launch's world is a fact no hello enlarges (a claim of a larger world allocates no
        views). A launch's world larger than every kept rank's hello says is the file's claim
        against what the ranks' own environment said (their WORLD_SIZE, set by the launch that
        really ran): the hellos win, and `world_disputed` says so. Never above ev.MAX_RANKS."""
        sizes = [t.world_size for t in self.ranks.values() if t.world_size]
        said = min(max(sizes, default=0), ev.MAX_RANKS)
        seen = max(self.ranks, default=-1) + 1
        launch = self.info.world_size
        if launch and launch > 0:
            if said and said < launch:
                return min(max(said, seen), ev.MAX_RANKS)
            return min(launch, ev.MAX_RANKS)
        return min(max(said, seen), ev.MAX_RANKS)  # a made-up world size allocates no views

    @property
    def world_disputed(self) -> tuple[int, int] | None:
        """(run.json's world size, the ranks' own) when the ranks' hellos say a smaller one."""
        launch = self.info.world_size
        world = self.world_size
        return (launch, world) if launch and launch > world else None

    @property
    def training_started(self) -> bool:
        return self.training_start_t is not None

    def thresholds(self, hang_after: float | None) -> Thresholds:
        periods = [t.heartbeat_period for t in self.ranks.values() if t.heartbeat_period]
        start = self.training_start_t
        training_waits = (d for s, d in self.waits if start is not None and s >= start)
        timeouts = [
            (t.pg_timeout_s, t.pg_timeout_given) for t in self.ranks.values() if t.pg_timeout_s
        ]
        return compute_thresholds(
            hang_after=hang_after,
            step_times=list(self.step_times),
            training_waits=training_waits,
            all_waits=[d for _, d in self.waits],
            heartbeat_period=max(periods) if periods else None,
            training_started=self.training_started,
            pg_timeout_s=min(timeouts)[0] if timeouts else None,
            pg_timeout_given=min(timeouts)[1] if timeouts else False,
            backend=next((t.backend for t in self.ranks.values() if t.backend), None)
            or self.info.backend,
        )

    # -- snapshot --------------------------------------------------------------------------

    def snapshot(
        self, now: float, *, live: bool = True, hang_after: float | None = None
    ) -> Snapshot:
        thresholds = self.thresholds(hang_after)
        world = self.world_size
        views = self._views(world, now, live, thresholds)
        if not live:
            views = settle_post_mortem(views)
        views = fill_waiting_on(views)
        attempts = self.attempts.view(self.ranks)
        if attempts is not None:  # each rank's restarts, for its row
            restarts = dict(attempts.rank_attempts)
            views = [
                replace(v, restarts=restarts[v.rank]) if restarts.get(v.rank) else v for v in views
            ]
        all_finished = bool(views) and all(v.state.finished for v in views)
        finished = all_finished or (not live and bool(views))
        verdict = Verdict.RUNNING
        if all_finished and all(v.state is RankState.DONE for v in views):
            verdict = Verdict.HEALTHY
        return Snapshot(
            run=self.info
            if self.info.world_size == world
            else replace(self.info, world_size=world),
            taken_t=now,
            ranks=tuple(views),
            verdict=verdict,
            logs=tuple(self.logs),
            finished=finished,
            thresholds=thresholds,
            live=live,
            nodes_missing=launchers.nodes_missing(self.info.nnodes, self.nodes, self.ranks),
            launchers=launcher_views(self.ranks, live=live, groups=self._groups()),
            # a torchft replica group's restart is not an attempt of the run: the torchft rule
            # tells it (the ranks' rows keep their restarts)
            attempts=None if self.replicas.active else attempts,
            torchft=self.replicas.view(self._agent_exit_of) if self.replicas.active else None,
            pairings=self.pairings.view(self.ranks),
        )

    def _agent_exit_of(self, pid: int) -> tuple[int | None, str | None] | None:
        """(exit code, signal) torchrun's log gives the process `pid`, if it names it."""
        for parser in self.agents.values():
            found = parser.exits.get(pid)
            if found is not None:
                return found.exit_code, found.signal
        return None

    def _groups(self) -> LauncherGroups:
        """The ranks grouped by launcher, kept until a hello or a new rank changes them."""
        if self._launcher_groups is None or len(self.ranks) != self._grouped_ranks:
            self._launcher_groups = launcher_groups(self.ranks)
            self._grouped_ranks = len(self.ranks)
        return self._launcher_groups
