"""A node's word that one of its ranks is gone, checked before it ends the rank.

A node whose watcher sees its ranks' processes (the Ray relay's node actor) names in its summary
the ranks whose process it saw end without an exit event (`gone`, ddpdoctor.protocol.node_summary).
The summary is a file of the run directory, which any process of the job can write: a rank that
wrote another node's summary with `"gone": [1]` once got rank 1 called vanished and the job
stopped while rank 1 trained on. So the claim counts only when

- the summary is that node's launcher's: its host and pid are those of the node's record, and
  that launcher runs, where this watcher can see it;
- the rank's process is not seen alive by this watcher (a rank of this host: its pid);
- the node goes on saying so, and the rank's record stays silent, for CONFIRM_S (a live rank
  heartbeats every second): signs of the rank's life after the claim refute it. Any other
  change of its record (its record read afresh from its file, as when its node's summary stops
  standing at the job's end) is no sign of life: the claim stands, and the run's last look,
  after every file was read, acts on what nothing refuted (an ended job's rank does not run).

A sign of life is what a record made from the summaries and one read from the file agree on: a
later heartbeat or step (a summary carries each rank's latest), or any event made after the
claim (its time later than the summary's, both of the rank's host's clock). Not merely a later
last event: a summary carries the rank's state, not every event (a Ray worker's final
`replica_digest` and `ray_call`, written before its process ended, are not in it), so the file
read afresh at the end has events later than any the summaries gave, though none came after.

A refuted claim is reported (a finding), never acted on. A claim costs a real loss CONFIRM_S.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.liveness import pid_alive
from ddpdoctor.monitor.model.event_fields import num
from ddpdoctor.rank_ranges import named_ranks

CONFIRM_S = 3.0
MAX_REFUTED = 64  # refutations kept for the finding


class GoneClaims:
    """The `gone` claims read from the nodes' summaries: pending, refuted, or acted on."""

    def __init__(self) -> None:
        # rank -> (node, when first settled here (None: not yet), its record's mark then, the
        # claim's time (its node's clock: the summary's; None when it has none))
        self.pending: dict[int, tuple[int, float | None, tuple[Any, ...], float | None]] = {}
        self.refuted: dict[int, str] = {}

    def claim(
        self,
        node: int,
        summary: Any,
        state: Any,
        local: Callable[[str | None], bool],
        of_node: Callable[[int], bool],
    ) -> None:
        """A summary of `node` was read: note the ranks it names gone (those this watcher
        follows through that node, `of_node`), refuting at once what it can see is not so."""
        named = {rank for rank in summary.gone[:4096] if of_node(rank)}
        for rank, (from_node, *_) in list(self.pending.items()):
            if from_node == node and rank not in named:
                del self.pending[rank]
                self._refute(rank, f"node {node}'s next summary no longer names it gone")
        if not named:
            return
        record = state.nodes.get(node)
        writer = None
        if record is None or (summary.host, summary.pid) != (record.host, record.launcher_pid):
            writer = f"node {node}'s summary that names it gone is not its launcher's (host and pid differ from its record)"
        elif local(record.host) and not pid_alive(record.launcher_pid):
            writer = f"node {node}'s launcher (pid {record.launcher_pid}) no longer runs"
        for rank in sorted(named):
            tracker = state.ranks.get(rank)
            if tracker is None or tracker.exit_code is not None or rank in self.pending:
                continue
            if writer is not None:
                self._refute(rank, writer)
            elif local(tracker.host) and tracker.pid and pid_alive(tracker.pid, tracker.hello_t):
                self._refute(rank, f"its process (pid {tracker.pid}) runs")
            else:
                self.pending[rank] = (node, None, _mark(tracker), num(getattr(summary, "t", None)))

    def settle(self, state: Any, now: float, final: bool = False) -> None:
        """Act on the claims that held for CONFIRM_S with the rank silent (the rank is gone).
        `final`: the run's last look, after every rank's file was read: a claim nothing
        refuted holds then without the wait (the job is over; its rank is not still running)."""
        for rank, (node, first, mark, claim_t) in list(self.pending.items()):
            tracker = state.ranks.get(rank)
            if tracker is None or tracker.exit_code is not None:
                del self.pending[rank]
                continue
            if _mark(tracker) != mark:
                if _went_on(tracker, mark, claim_t):
                    del self.pending[rank]
                    self._refute(
                        rank, f"its events went on after node {node}'s summary named it gone"
                    )
                    continue
                # its record was read again (its node's summary stopped standing as the job
                # ended: its own file, from the start), with the events the summaries did not
                # carry and no sign of life: the claim stands, on the record as it is now
                mark = _mark(tracker)
                self.pending[rank] = (node, first, mark, claim_t)
            if final or (first is not None and now - first >= CONFIRM_S):
                del self.pending[rank]
                state.set_alive(rank, False)
            elif first is None:
                self.pending[rank] = (node, now, mark, claim_t)

    def _refute(self, rank: int, why: str) -> None:
        if rank in self.refuted or len(self.refuted) < MAX_REFUTED:
            self.refuted[rank] = why

    def findings(self) -> list[Finding]:
        if not self.refuted:
            return []
        said = sorted(self.refuted.items())
        lines = "; ".join(f"rank {rank}: {why}" for rank, why in said[:6])
        return [
            Finding(
                "node.gone_refuted",
                Severity.WARNING,
                f"{named_ranks(r for r, _ in said)} not taken as gone: a node summary said so, "
                f"but what ddpdoctor saw does not ({lines})",
                "A node's summary is written by its own launcher. A claim in it that the "
                "launcher's record, the rank's process or its later events contradict is "
                "reported, never acted on.",
            )
        ]


def _mark(tracker: Any) -> tuple[Any, ...]:
    """What changes when a rank's record gets anything new (an event, a row)."""
    return (tracker.events_seen, tracker.last_event_t, tracker.step, tracker.last_heartbeat_t)


# A row's times are rounded to a tenth of a millisecond (rank_rows.TIME_DIGITS): the same event
# read again from the rank's file is up to that much later
SAME_EVENT_S = 0.001


def _went_on(tracker: Any, mark: tuple[Any, ...], claim_t: float | None) -> bool:
    """Whether the rank's record shows life after the claim: a later heartbeat or step than
    it had then (the latest of each is in every summary, so a record read afresh from the file
    has the same ones), or an event made after the claim. Not the events that the summaries
    did not carry, read from the file: they are older than the claim."""
    _, marked_t, marked_step, marked_beat = mark
    t, step, beat = tracker.last_event_t, tracker.step, tracker.last_heartbeat_t
    later_beat = beat is not None and (marked_beat is None or beat > marked_beat + SAME_EVENT_S)
    later_step = step is not None and (marked_step is None or step > marked_step)
    later_event = (
        t is not None
        and claim_t is not None
        and t > claim_t
        and (marked_t is None or t > marked_t + SAME_EVENT_S)
    )
    return later_beat or later_step or later_event
