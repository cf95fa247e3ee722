"""RunState: every event and log line of a run folded into per-rank state; `snapshot(now)` freezes it.

`apply(event)` takes one event of any rank (in file order per rank); `apply_log_lines()` takes new
lines of a log file. `snapshot(now)` builds the frozen Snapshot the rules, the TUI and the text
view share: per rank its state, progress, timings, the collective in progress and whom it waits on.
The diagnosis (verdict, findings, culprits) is added by ddpdoctor.monitor.diagnose.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ddpdoctor.monitor.launchers import LauncherGroups, launcher_groups, launcher_views
from ddpdoctor.monitor.progress import activity
from ddpdoctor.monitor.rank_tracker import RankTracker, num
from ddpdoctor.monitor.snapshot import (
    CollectiveView,
    LogLine,
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    Thresholds,
    Verdict,
    build_frozen,
)
from ddpdoctor.monitor.thresholds import compute_thresholds
from ddpdoctor.monitor.views_together import fill_waiting_on, settle_post_mortem
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.torchrun_logs import (
    AGENT_LOG,
    NCCL_LOG,
    RANK_LOG,
    AgentLogParser,
    LogSource,
)
from ddpdoctor.protocol.trust import agent_log_origin, report_may_end_rank

LOG_RING = 1000  # recent log lines kept for the logs panel
# torchrun --tee copies every rank line into its own output as "[default3]:...": already read
# from the rank's own log file, so not shown twice.
_TEE_PREFIX = "[default"
_CLASSIFIED_LEVELS = ("error", "warn")

_FINISHED = frozenset(state for state in RankState if state.finished)
_NUMBER = (float, int)
# States whose view only a new record of the rank changes (time moves nothing but its ages).
_STEADY = frozenset({RankState.RUNNING, RankState.IN_COLLECTIVE, RankState.STARTING})

Classifier = Callable[[str], Any]  # text -> LineClass(level, finding_id) | None


class RunState:
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
        if rank in self.reported:  # (a record made from rows never takes events on top)
            self.restart_rank(rank)
        tracker = self.tracker(rank)
        tracker.apply(event, where)
        self.events_applied += 1
        kind = event["kind"]
        t = num(event.get("t"))
        if t is not None and (self.last_t is None or t > self.last_t):
            self.last_t = t
        if kind == ev.STEP:
            if tracker.step_time_s is not None:
                self.step_times.append(tracker.step_time_s)
            self._training_started(t)
        elif kind == ev.PHASE and event.get("phase") == "train":
            self._training_started(t)
        elif kind == ev.COLLECTIVE_END and event.get("ok", True) is not False:
            duration = num(event.get("duration_s"))
            if duration is not None and t is not None:
                self.waits.append((t - duration, duration))
        elif kind == ev.HELLO:
            self._by_node_local = None
            self._launcher_groups = None
            if tracker.host is not None and tracker.local_rank is not None:
                self.by_local[(tracker.host, tracker.local_rank)] = rank
            if tracker.host is not None and tracker.pid is not None:
                self.by_pid[(tracker.host, tracker.pid)] = rank

    def row_applied(self, tracker: RankTracker, *, stepped: bool) -> None:
        """What `apply` notes of a rank's events, for a row copied onto its record (a rank of
        another node, ddpdoctor.monitor.rank_rows): its step time once per row, not per step."""
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
        known = max(self.info.world_size or 0, self.hello_world)
        return min(known, ev.MAX_RANKS) if known > 0 else ev.MAX_RANKS

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

    def set_alive(self, rank: int, alive: bool | None) -> None:
        if self.alive.get(rank, alive) != alive or rank not in self.alive:
            self._remake.add(rank)
        self.alive[rank] = alive

    # -- derived ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        sizes = [t.world_size for t in self.ranks.values() if t.world_size]
        known = max(sizes, default=0)
        world = max(known, self.info.world_size or 0, max(self.ranks, default=-1) + 1)
        return min(world, ev.MAX_RANKS)  # a made-up world size allocates no views

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

    def agent_exit(self, tracker: RankTracker):
        """torchrun's record of this rank's exit (matched by pid, else by rank), if any."""
        if not self.agents:
            return None
        for parser in self.agents.values():
            if tracker.pid is not None and tracker.pid in parser.exits:
                return parser.exits[tracker.pid]
        for parser in self.agents.values():
            for found in parser.exits.values():
                if found.rank == tracker.rank and tracker.pid is None:
                    return found
        return None

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
        all_finished = bool(views) and all(v.state.finished for v in views)
        finished = all_finished or (not live and bool(views))
        verdict = Verdict.RUNNING
        if all_finished and all(v.state is RankState.DONE for v in views):
            verdict = Verdict.HEALTHY
        return Snapshot(
            run=self.info if self.info.world_size else replace(self.info, world_size=world),
            taken_t=now,
            ranks=tuple(views),
            verdict=verdict,
            logs=tuple(self.logs),
            finished=finished,
            thresholds=thresholds,
            live=live,
            nodes_missing=self._nodes_missing(),
            launchers=launcher_views(self.ranks, live=live, groups=self._groups()),
        )

    def _views(self, world: int, now: float, live: bool, th: Thresholds) -> list[RankView]:
        """Every rank's view at `now`. A view of a rank its node's rows made stands, unchanged,
        until its next row or until its state could change (`_steady_until`): at 1000s of
        ranks most views of most polls are such. Until the first of those times, a poll makes
        again only the views of the other ranks and of those whose record changed (`_remake`),
        and takes the rest from the previous poll."""
        if not live or self.agents or not self.reported:
            self._last_views = None
            return [self._view(r, now, live, th) for r in range(world)]
        key = (world, self.info)
        times = (th.heartbeat_stale_s, th.waiting_after_s, th.hang_after_s)
        # The thresholds move a little with every row (the step times, the heartbeat period):
        # a standing view's `until` comes that much earlier when one of them fell since.
        fell = max(0.0, *(was - is_ for was, is_ in zip(self._last_ref, times, strict=True)))
        last = self._last_views
        if last is not None and key == self._last_key and now < self._last_until - fell:
            self._last_ref = tuple(map(max, self._last_ref, times))  # (each, the largest)
            views = list(last)
            if self._others is None:
                self._others = [r for r in range(world) if r not in self.reported]
            for r in self._others:
                views[r] = self._view(r, now, live, th)
            for r in self._remake:
                if r < world:
                    views[r] = view = self._view(r, now, live, th)
                    tracker = self.ranks.get(r)
                    if tracker is not None and tracker.view is view:
                        self._last_until = min(self._last_until, tracker.view_until)
                    else:
                        self._last_until = now  # (not a standing view: a whole poll next)
        else:
            views = [self._view(r, now, live, th) for r in range(world)]
            until = math.inf
            for r in self.reported:
                tracker = self.ranks[r]
                if r < world and tracker.view is views[r]:
                    until = min(until, tracker.view_until)
                else:
                    until = now
            self._last_key, self._last_until, self._last_ref = key, until, times
        self._remake.clear()
        self._last_views = views.copy()  # (fill_waiting_on replaces some in `views`)
        return views

    def _groups(self) -> LauncherGroups:
        """The ranks grouped by launcher, kept until a hello or a new rank changes them."""
        if self._launcher_groups is None or len(self.ranks) != self._grouped_ranks:
            self._launcher_groups = launcher_groups(self.ranks)
            self._grouped_ranks = len(self.ranks)
        return self._launcher_groups

    def _nodes_missing(self) -> tuple[int, ...]:
        """The launchers of a job over several nodes that have not recorded themselves, while no
        rank has started (once one has, the rendezvous is complete and no node is missing)."""
        expected = self.info.nnodes or 1
        if expected < 2 or not self.nodes or self.ranks:
            return ()
        return tuple(node for node in range(expected) if node not in self.nodes)

    def _view(self, rank: int, now: float, live: bool, th: Thresholds) -> RankView:
        tracker = self.ranks.get(rank)
        if tracker is None:
            tracker = RankTracker(rank)  # no events yet: starting (or never started)
        reported = live and rank in self.reported
        if reported:
            # A rank of another node changes once a row, once a second: its view stands until
            # then, unless its state changes (a wait, a silence) at this watcher's clock. Its
            # ages (heartbeat, activity, collective) are as of that view.
            cached = tracker.view
            if (
                cached is not None
                and tracker.view_version == tracker.version
                and cached.alive == self.alive.get(rank)
            ):
                state = self._state(tracker, now, live, th)[0]
                if state is cached.state and state in _STEADY:
                    tracker.view_until = _steady_until(tracker, th)
                    tracker.view_key = (th.heartbeat_stale_s, th.waiting_after_s, th.hang_after_s)
                    return cached
        state, failed_t, exit_code, exit_signal = self._state(tracker, now, live, th)
        finished = state in _FINISHED
        collective = tracker.current_collective()
        if collective is None and finished and tracker.failed_collective is not None:
            collective = tracker.failed_collective  # what it waited in when it failed
        elif collective is not None:
            end = now
            if finished:
                end = failed_t or tracker.exit_t or tracker.last_event_t or now
            since = collective.since_t if collective.since_t is not None else end
            collective = CollectiveView(  # (not dataclasses.replace: this runs per rank per poll)
                collective.op,
                collective.seq,
                max(0.0, end - since),
                collective.group,
                collective.shapes,
                collective.dtypes,
                collective.since_t,
                collective.group_ranks,
                site=collective.site,
            )
        hb_age = None
        if tracker.last_heartbeat_t is not None:
            hb_age = max(0.0, now - tracker.last_heartbeat_t)
        doing = None
        if not finished and (hb_age is None or hb_age <= th.heartbeat_stale_s):
            # a silent heartbeat says nothing about now: the rank stays unknown (stalled)
            doing = activity(
                tracker.progress.judge(),
                now=now,
                in_collective=collective is not None,
                in_collective_since=collective.since_t if collective is not None else None,
            )
        settled = self._settled_fields(tracker)
        now_fields = {
            "rank": rank,
            "state": state,
            "total_steps": self.info.total_steps,
            "collective": collective,
            "heartbeat_age_s": hb_age,
            "alive": self.alive.get(rank),
            "exit_code": exit_code,
            "failed_t": failed_t,
            "exit_signal": exit_signal,
            "activity": doing,
            "reports_progress": tracker.progress.reports,
        }
        if reported:  # its settled fields were made for this view alone: completed in place
            settled.update(now_fields)
            view = build_frozen(RankView, settled)
        else:
            view = build_frozen(RankView, {**settled, **now_fields})
        if reported:
            tracker.view, tracker.view_version = view, tracker.version
            tracker.view_until = _steady_until(tracker, th) if state in _STEADY else now
            tracker.view_key = (th.heartbeat_stale_s, th.waiting_after_s, th.hang_after_s)
        return view

    def _settled_fields(self, tracker: RankTracker) -> dict[str, Any]:
        """A rank's view fields that only its events and log lines change (not to be changed):
        made again only after it changed, for a rank of another node once a second at most, not
        per poll."""
        reported = tracker.rank in self.reported  # (a fresh dict each time: its view keeps it)
        cached = None if reported else self._settled.get(tracker.rank)
        if cached is not None and cached[0] is tracker and cached[1] == tracker.version:
            return cached[2]
        data, compute, comm, n = tracker.own_work_means()
        fields = {  # (a literal: this runs per rank per second at 1000s of ranks)
            "host": tracker.host,
            "pid": tracker.pid,
            "local_rank": tracker.local_rank,
            "phase": tracker.phase,
            "step": tracker.step,
            "epoch": tracker.epoch,
            "loss": tracker.loss,
            "step_time_s": tracker.step_time_s,
            "data_time_s": tracker.data_time_s,
            "compute_time_s": tracker.compute_time_s,
            "comm_wait_s": tracker.comm_wait_s,
            "samples_per_s": tracker.samples_per_s,
            "collectives_done": tracker.collectives_done,
            "error": tracker.error,
            "last_event": tracker.last_event,
            "rss_bytes": tracker.rss_bytes,
            "gpu_mem_bytes": tracker.gpu_mem_bytes,
            "step_times": tuple(tracker.step_times),
            "group_seqs": self._items(tracker.group_seqs),
            "recent_collectives": tracker.latest_calls(),
            "traceback": tracker.traceback,
            "exit_reason": tracker.exit_reason,
            "last_event_t": tracker.last_event_t,
            "last_progress_t": tracker.last_progress_t,
            "last_heartbeat_t": tracker.last_heartbeat_t,
            "fault": tracker.fault,
            "warnings": tuple(tracker.warnings.items()),
            "epoch_batches": tracker.epoch_batches,
            "loader_batches": tuple(tracker.loader_batches.items()),
            "avg_data_time_s": data,
            "avg_compute_time_s": compute,
            "avg_comm_wait_s": comm,
            "avg_steps": n,
            "error_at": tracker.error_at,
            "error_line": tracker.error_line,
            "error_lines": tuple(tracker.error_lines),
            "calls_key": tracker.calls_key(),
        }
        # (a rank not yet heard of gets a fresh tracker every poll; a rank its node's rows make
        # keeps its whole view instead)
        if tracker.events_seen and not reported:
            self._settled[tracker.rank] = (tracker, tracker.version, fields)
        return fields

    def _items(self, values: dict[str, int]) -> tuple[tuple[str, int], ...]:
        """tuple(values.items()), made once per dict: the ranks a node's rows made share one."""
        shared = self._shared_items
        if shared[0] is not values:
            shared = self._shared_items = (values, tuple(values.items()))
        return shared[1]

    def _state(
        self, tracker: RankTracker, now: float, live: bool, th: Thresholds
    ) -> tuple[RankState, float | None, int | None, str | None]:
        """(state, failed_t, exit_code, exit_signal) of one rank at `now`."""
        if tracker.exit_code is not None:
            if tracker.exit_code == 0 and tracker.error_t is None:
                return RankState.DONE, None, 0, None
            return RankState.FAILED, tracker.failed_t, tracker.exit_code, tracker.exit_signal
        if tracker.error_t is not None:
            return RankState.FAILED, tracker.error_t, None, None
        agent = self.agent_exit(tracker)
        vanished_t = tracker.last_event_t
        if agent is not None and report_may_end_rank(
            agent_log_origin(self.info.launch_mode),
            alive=self.alive.get(tracker.rank),
            live=live,
        ):  # torchrun's table explains an end ddpdoctor saw; it never ends a running rank
            if tracker.agent_exit_code is None:
                tracker.agent_exit_code = agent.exit_code
                key = next((k for k, p in self.agents.items() if agent.pid in p.exits), "")
                if agent.line_no is not None and key in self.agent_files:
                    tracker.add_error_line(
                        LogLine(
                            f"torchrun {key}",
                            f"torchrun: rank {tracker.rank} exitcode {agent.exit_code}"
                            + (f" ({agent.signal})" if agent.signal else ""),
                            tracker.rank,
                            "error",
                            self.agent_files[key],
                            agent.line_no,
                        )
                    )
            state = RankState.DONE if agent.exit_code == 0 else RankState.GONE
            return (
                state,
                vanished_t if state is RankState.GONE else None,
                agent.exit_code,
                agent.signal,
            )
        if self.alive.get(tracker.rank) is False:
            return RankState.GONE, vanished_t, None, None
        if tracker.events_seen == 0:
            return RankState.STARTING, None, None, None
        last_sign = tracker.last_heartbeat_t or tracker.last_event_t
        if last_sign is not None and now - last_sign > th.heartbeat_stale_s:
            if not live:
                return RankState.GONE, vanished_t, None, None  # its record ends before the run's
            if self.alive.get(tracker.rank) is not True:
                return RankState.STALLED, None, None, None  # heartbeat stopped
        collective = tracker.current_collective()
        if collective is not None:
            since = collective.since_t if collective.since_t is not None else now
            if now - since >= th.waiting_after_s:
                return RankState.WAITING, None, None, None
            return RankState.IN_COLLECTIVE, None, None, None
        if tracker.step is None and tracker.phase in (None, "init"):
            return RankState.STARTING, None, None, None
        if tracker.last_progress_t is not None and now - tracker.last_progress_t > th.hang_after_s:
            judged = tracker.progress.judge()
            if judged is not None and judged.state.progressing:
                return RankState.RUNNING, None, None, None  # no events, but busy in its own code
            return RankState.STALLED, None, None, None
        return RankState.RUNNING, None, None, None


def _steady_until(tracker: RankTracker, th: Thresholds) -> float:
    """Until when `RunState._state` cannot move a live rank out of the steady state it is in
    (RUNNING, IN_COLLECTIVE or STARTING) unless its record changes: the first of the times its
    checks compare the clock with. Kept next to `_state`, whose checks it mirrors."""
    until = math.inf
    last_sign = tracker.last_heartbeat_t or tracker.last_event_t
    if last_sign is not None:
        until = last_sign + th.heartbeat_stale_s  # its heartbeat stops: stalled
    collective = tracker.current_collective()
    if collective is not None:
        if collective.since_t is not None:  # in it long enough: waiting
            until = min(until, collective.since_t + th.waiting_after_s)
    elif tracker.last_progress_t is not None:  # no progress for that long: judged again
        until = min(until, tracker.last_progress_t + th.hang_after_s)
    return until
