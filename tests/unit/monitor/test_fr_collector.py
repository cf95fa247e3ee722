"""When the monitor asks the ranks for their flight-recorder dumps (monitor/follow/fr_collector.py)."""

from __future__ import annotations

from ddpdoctor.monitor.follow.fr_collector import FrCollector, suspicious
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_builders import NOW, snap, view


def _idle(rank: int, joined: bool, idle_s: float = 8.0, **kw):
    return view(rank, RankState.STALLED, joined=joined, last_progress_t=NOW - idle_s, **kw)


def test_a_joined_rank_without_progress_is_asked_for_its_dump():
    assert suspicious(snap([_idle(0, True), view(1, joined=True)]))
    assert not suspicious(snap([view(0, joined=True), view(1, joined=True)]))


def test_ranks_that_have_not_joined_have_no_flight_recorder_to_ask():
    """Ranks waiting at the start (in init_process_group for a slow or lost host): nothing to
    dump, whatever the verdict; once one has joined, its peers' silence counts again."""
    starting = [_idle(0, False, step=None, seq=0), _idle(1, False, step=None, seq=0)]
    assert not suspicious(snap(starting))
    assert not suspicious(snap(starting, verdict=Verdict.HANG))
    joined = [view(0, joined=True), _idle(1, False, step=None, seq=0)]
    assert not suspicious(snap(joined))  # the silent rank itself has no recorder yet
    assert suspicious(snap(joined, verdict=Verdict.HANG))


def test_the_collector_writes_no_request_while_no_rank_has_joined(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    collector = FrCollector(run, clock=lambda: NOW)
    starting = snap([_idle(0, False, step=None, seq=0)], verdict=Verdict.HANG, live=True)
    assert not collector.maybe_ask(starting, NOW) and collector.asks == 0
    joined = snap([_idle(0, True)], verdict=Verdict.HANG, live=True)
    assert collector.maybe_ask(joined, NOW) and collector.asks == 1
