"""The view of each rank at a moment: its state by the clock, and its fields (RunState's half).

RunState (ddpdoctor.monitor.model.state) folds events, rows and log lines into a record per rank;
`RankViews` makes the frozen RankView of each rank at `now` from those records, for its
snapshot: the state the clock gives a rank (running, waiting, stalled, gone, ...), what it is
doing, and every field the rules, the TUI and diagnosis.json read. The view of a rank its node's
rows made stands until its record or its state changes (`_views`, `_steady_until`).
"""

from __future__ import annotations

import math
from typing import Any

from ddpdoctor.monitor.model.progress import activity
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    LogLine,
    RankState,
    RankView,
    RunInfo,
    Thresholds,
    build_frozen,
)
from ddpdoctor.protocol.torchrun_logs import AgentLogParser
from ddpdoctor.protocol.trust import agent_log_origin, report_may_end_rank

_FINISHED = frozenset(state for state in RankState if state.finished)
# States whose view only a new record of the rank changes (time moves nothing but its ages).
_STEADY = frozenset({RankState.RUNNING, RankState.IN_COLLECTIVE, RankState.STARTING})


class RankViews:
    """Making the views of RunState's ranks (a part of RunState: it holds these attributes)."""

    info: RunInfo
    ranks: dict[int, RankTracker]
    alive: dict[int, bool | None]
    agents: dict[str, AgentLogParser]
    agent_files: dict[str, str]
    reported: set[int]
    events_lost: str | None
    _settled: dict[int, tuple[RankTracker, int, dict[str, Any]]]
    _shared_items: tuple[dict[str, int] | None, tuple[tuple[str, int], ...]]
    _last_views: list[RankView] | None
    _last_key: tuple[Any, ...]
    _last_until: float
    _last_ref: tuple[float, ...]
    _remake: set[int]
    _others: list[int] | None

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
        # a live rank's calls as its process bore them out (call_events.bear); what a rank
        # that ended left stands as it is
        borne = live and not finished and bool(tracker.unborne or tracker.claimed)
        collective = tracker.current_collective(borne=borne)
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
                peers=collective.peers,
                step=collective.step,
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
            "joined": tracker.backend is not None or bool(tracker.group_seqs or tracker.step),
        }
        if (tracker.unborne or tracker.claimed) and not borne:  # ended, or read later: all
            now_fields["recent_collectives"] = tracker.latest_calls()
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
            "actor": tracker.ray_actor,
            "ray_call": tracker.ray_call,
            "local_rank": tracker.local_rank,
            "phase": tracker.phase,
            "step": tracker.step,
            "step_forwards": tracker.step_forwards,
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
            "recent_collectives": tracker.borne_calls(),
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
            "runq_share": tracker.progress.runq_share(),
            "error_at": tracker.error_at,
            "error_line": tracker.error_line,
            "error_lines": tuple(tracker.error_lines),
            "calls_key": tracker.calls_key(),
            "pipeline": tracker.pipeline,
            "sends_p2p": tracker.sends_p2p,
            "replica_digests": tracker.replicas.view(),
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
        if tracker.exit_doubted:
            return RankState.RUNNING, None, None, None  # its process runs on: not ended (seen)
        if tracker.exit_code is not None:
            if tracker.exit_code == 0 and tracker.error_t is None:
                return RankState.DONE, None, 0, None
            return RankState.FAILED, tracker.failed_t, tracker.exit_code, tracker.exit_signal
        if tracker.error_t is not None and not (
            live and _error_unconfirmed(tracker, self.alive.get(tracker.rank), now, th)
        ):  # an error line its process has not borne out yet ends nothing while it runs
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
        if self.events_lost is not None:
            lost = events_lost_state(tracker, self.alive.get(tracker.rank), now, th)
            if lost is not None:
                return lost, None, None, None
        if self.alive.get(tracker.rank) is False:
            if tracker.ray_busy is False:  # Ray ended it after its code returned
                return RankState.DONE, None, None, None
            return RankState.GONE, vanished_t, None, None
        if tracker.events_seen == 0:
            return RankState.STARTING, None, None, None
        if tracker.ray_busy is False and not live:
            return RankState.DONE, None, None, None  # a Ray worker whose calls had all returned
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
        if tracker.ray_busy is False:
            return RankState.RUNNING, None, None, None  # a Ray worker waiting for its next call
        if tracker.last_progress_t is not None and now - tracker.last_progress_t > th.hang_after_s:
            judged = tracker.progress.judge()
            if judged is not None and judged.state.progressing:
                return RankState.RUNNING, None, None, None  # no events, but busy in its own code
            return RankState.STALLED, None, None, None
        return RankState.RUNNING, None, None, None


def events_lost_state(
    tracker: RankTracker, alive: bool | None, now: float, th: Thresholds
) -> RankState | None:
    """A rank's state while its events cannot be written (the run directory's file system is
    full or read-only): a process gone without an exit event ended as far as ddpdoctor knows
    (how, its launcher's exit status tells: ddpdoctor.monitor.judge.run_end), and a record gone
    quiet says nothing about progress. None: its record still speaks."""
    if alive is False:
        return RankState.DONE
    last_sign = tracker.last_heartbeat_t or tracker.last_event_t
    if last_sign is not None and now - last_sign > th.heartbeat_stale_s:
        return RankState.RUNNING
    return None


def _error_unconfirmed(
    tracker: RankTracker, alive: bool | None, now: float, th: Thresholds
) -> bool:
    """A fatal error line that its process has not borne out yet (its runtime's heartbeats
    count it: RankTracker._weigh_error) while that process may still run: the rank is not
    failed for a line any process could have appended. It stands once the process is seen
    gone, or once no heartbeat has come for heartbeat_stale_s after it (a runtime stuck after
    its error cannot beat)."""
    if not tracker.error_unconfirmed or alive is False or tracker.error_t is None:
        return False
    return now < _error_stands_t(tracker, th)


def _error_stands_t(tracker: RankTracker, th: Thresholds) -> float:
    since = tracker.error_t or 0.0
    if tracker.last_heartbeat_t is not None and tracker.last_heartbeat_t > since:
        since = tracker.last_heartbeat_t
    return since + th.heartbeat_stale_s


def _steady_until(tracker: RankTracker, th: Thresholds) -> float:
    """Until when `RunState._state` cannot move a live rank out of the steady state it is in
    (RUNNING, IN_COLLECTIVE or STARTING) unless its record changes: the first of the times its
    checks compare the clock with. Kept next to `_state`, whose checks it mirrors."""
    until = math.inf
    if tracker.error_unconfirmed and tracker.error_t is not None:
        until = _error_stands_t(tracker, th)  # its error stands then, unless borne out before
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
