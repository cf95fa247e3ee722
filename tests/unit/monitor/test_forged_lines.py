"""Lines appended to a live rank's event file by another process decide nothing (issue 40):
a collective its own process did not number so, or that its heartbeats say it never entered, is
not compared; a fatal error its runtime's heartbeats do not count does not end it. Real ones
still do: an error the heartbeats count, or after which the runtime falls silent, is a crash;
calls that really differ are a mismatch."""

from __future__ import annotations

import time

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.judge.rules import mismatch
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_monitor import Clock, train
from tests.unit.monitor.test_vouching import KW, command_run, healthy_pair

ALL_REDUCE = {"op": "all_reduce", "group": "default", "shapes": [[10]], "dtypes": ["float32"]}
BROADCAST = {"op": "broadcast", "group": "default", "shapes": [[7, 3]], "dtypes": ["float32"]}


def apply(tracker: RankTracker, kind: str, t: float = 1.0, **fields) -> None:
    tracker.apply({"kind": kind, "t": t, "rank": tracker.rank, **fields})


def calls(tracker: RankTracker) -> list[tuple[str, int]]:
    return [(c.op, c.seq) for c in tracker.latest_calls()]


def test_a_call_numbered_twice_drops_both_and_the_count_goes_on():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "collective_start", seq=10, **ALL_REDUCE)
    apply(tracker, "collective_end", seq=10, **ALL_REDUCE)
    apply(tracker, "collective_start", seq=11, **BROADCAST)  # appended by another process
    apply(tracker, "collective_start", seq=11, **ALL_REDUCE)  # its own
    apply(tracker, "collective_end", seq=11, **ALL_REDUCE)
    apply(tracker, "collective_start", seq=12, **ALL_REDUCE)
    assert calls(tracker) == [("all_reduce", 10), ("all_reduce", 12)]
    assert tracker.disputed is not None and "two calls numbered #11" in tracker.disputed
    assert "broadcast #11 of [7, 3]" in tracker.disputed


def test_a_call_forged_ahead_is_dropped_when_the_own_count_comes_back():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "collective_start", seq=10, **ALL_REDUCE)
    apply(tracker, "collective_start", seq=15, **BROADCAST)
    apply(tracker, "collective_start", seq=11, **ALL_REDUCE)
    apply(tracker, "collective_start", seq=12, **ALL_REDUCE)
    assert calls(tracker) == [("all_reduce", 10), ("all_reduce", 12)]
    assert tracker.disputed_calls == 1


def test_a_new_process_of_the_rank_counts_from_one_again():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "collective_start", seq=5, **ALL_REDUCE)
    apply(tracker, "hello", pid=43, host="h")  # torchrun restarted it
    apply(tracker, "collective_start", seq=1, **ALL_REDUCE)
    assert calls(tracker) == [("all_reduce", 1)] and tracker.disputed is None


def test_a_call_its_heartbeats_say_it_never_entered_is_dropped_at_the_second():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "heartbeat", open=None)
    apply(tracker, "collective_start", seq=10, **ALL_REDUCE)
    apply(tracker, "collective_end", seq=10, **ALL_REDUCE)
    apply(tracker, "collective_start", seq=11, **BROADCAST)  # appended; the rank computes
    assert ("broadcast", 11) not in tracker.borne_calls()  # nothing bore it out
    apply(tracker, "heartbeat", open=None)  # (may have been made before a real call began)
    assert ("broadcast", 11) in calls(tracker)
    apply(tracker, "heartbeat", open=None)
    assert calls(tracker) == [("all_reduce", 10)]
    assert "which its heartbeats say it never entered" in (tracker.disputed or "")


def test_a_call_its_heartbeats_show_open_or_that_ends_stays():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "collective_start", seq=11, **BROADCAST)
    for _ in range(3):  # blocked in it: its heartbeats say so
        apply(tracker, "heartbeat", open={"op": "broadcast", "seq": 11, "group": "default"})
    apply(tracker, "heartbeat", open=None)  # a beat made just before its end was written
    apply(tracker, "collective_end", seq=11, **BROADCAST)
    apply(tracker, "heartbeat", open=None)
    apply(tracker, "heartbeat", open=None)
    assert calls(tracker) == [("broadcast", 11)] and tracker.disputed is None
    old = RankTracker(2)  # a runtime whose heartbeats say nothing of calls denies nothing
    apply(old, "hello", pid=44, host="h")
    apply(old, "collective_start", seq=1, **BROADCAST)
    for _ in range(3):
        apply(old, "heartbeat", step=1)
    assert calls(old) == [("broadcast", 1)]


def _pair_with_forged_call(tmp_path):
    """Rank 0 waits in all_reduce #4; rank 1 (computing) gets a broadcast #4 appended."""
    run, clock = command_run(tmp_path), Clock(time.time())
    w = healthy_pair(run, clock)
    for rank in (0, 1):  # its runtime's heartbeats, which say the call it is in
        w.ev(rank, "heartbeat", open=None, errors=0)
    monitor = Monitor(run, clock=clock, **KW)
    monitor.poll()
    w.ev(0, "collective_start", seq=4, **ALL_REDUCE)
    w.ev(1, "collective_start", seq=4, **BROADCAST)
    return w, clock, monitor


def test_a_forged_call_makes_no_mismatch_not_even_for_a_poll(tmp_path):
    w, clock, monitor = _pair_with_forged_call(tmp_path)
    first = monitor.poll()  # nothing of rank 1's process bore the broadcast out yet
    assert first.verdict is not Verdict.MISMATCH, first.findings
    for _ in range(2):
        clock.t += 1.0
        w.ev(0, "heartbeat", open={"op": "all_reduce", "seq": 4, "group": "default"}, errors=0)
        w.ev(1, "heartbeat", open=None, errors=0)
    snap = monitor.poll()
    assert snap.verdict is not Verdict.MISMATCH and not snap.confirmed, snap.findings
    (finding,) = [f for f in snap.findings if f.id == "run.forged_calls"]
    assert "rank 1" in finding.summary and "broadcast #4" in finding.summary
    assert finding.severity.value == "warning"


def test_calls_that_really_differ_are_still_a_mismatch(tmp_path):
    w, clock, monitor = _pair_with_forged_call(tmp_path)
    assert monitor.poll().verdict is not Verdict.MISMATCH  # (borne out by nothing yet)
    clock.t += 1.0  # each rank's own heartbeat says it is in its call
    w.ev(0, "heartbeat", open={"op": "all_reduce", "seq": 4, "group": "default"}, errors=0)
    w.ev(1, "heartbeat", open={"op": "broadcast", "seq": 4, "group": "default"}, errors=0)
    snap = monitor.poll()
    assert snap.verdict is Verdict.MISMATCH and snap.confirmed
    assert mismatch.detect(snap) is not None


def _pair_with_error(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    w = healthy_pair(run, clock)
    for rank in (0, 1):  # its runtime's heartbeats, which count the errors it wrote
        w.ev(rank, "heartbeat", open=None, errors=0)
    monitor = Monitor(run, clock=clock, **KW)
    monitor.poll()
    w.ev(1, "error", exc_type="RuntimeError", message="forged: rank 1 failed", fatal=True)
    return w, clock, monitor


def test_an_error_its_runtime_does_not_count_ends_nothing(tmp_path):
    w, clock, monitor = _pair_with_error(tmp_path)
    first = monitor.poll()
    assert first.verdict is Verdict.RUNNING and first.ranks[1].state is not RankState.FAILED
    for _ in range(2):
        clock.t += 1.0
        w.ev(1, "heartbeat", step=3, open=None, errors=0)
        train(w, clock, 1, seq0=3 + _)
    snap = monitor.poll()
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    (finding,) = [f for f in snap.findings if f.id == "run.forged_exit"]
    assert "RuntimeError: forged: rank 1 failed" in finding.summary
    assert "its own heartbeats count no such error" in finding.summary
    clock.t += 60.0  # later: still nothing ended
    assert monitor.poll().ranks[1].state is not RankState.FAILED


def test_an_error_its_runtime_counts_is_a_crash(tmp_path):
    w, clock, monitor = _pair_with_error(tmp_path)
    clock.t += 1.0
    w.ev(1, "heartbeat", step=3, open=None, errors=1)
    snap = monitor.poll()
    assert snap.verdict is Verdict.CRASH and set(snap.culprits) == {1}
    assert snap.ranks[1].state is RankState.FAILED


def test_an_error_after_which_the_runtime_falls_silent_stands(tmp_path):
    """A runtime stuck after its error (its heartbeat thread held) cannot confirm it."""
    _w, clock, monitor = _pair_with_error(tmp_path)
    assert monitor.poll().ranks[1].state is not RankState.FAILED
    clock.t += 60.0
    snap = monitor.poll()
    assert snap.ranks[1].state is RankState.FAILED and snap.verdict is Verdict.CRASH


def test_an_older_runtimes_error_lines_are_taken_as_they_are():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h")
    apply(tracker, "heartbeat", step=3)  # no `errors`: a runtime that does not count them
    apply(tracker, "error", exc_type="RuntimeError", message="boom", fatal=True)
    assert not tracker.error_unconfirmed and tracker.error_t is not None
    counting = RankTracker(2)
    apply(counting, "hello", pid=43, host="h")
    apply(counting, "heartbeat", step=3, errors=0)
    apply(counting, "error", exc_type="RuntimeError", message="boom", fatal=True)
    assert counting.error_unconfirmed
    apply(counting, "heartbeat", step=3, errors=1)
    assert not counting.error_unconfirmed and counting.error_t is not None


def test_a_hello_that_names_its_heartbeats_fields_holds_lines_before_any_beat():
    """What another node's summary carries of a rank is a digest (its latest heartbeat only):
    the hello says what the runtime's heartbeats will say, so an error or a call read before
    any heartbeat of it is held all the same."""
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h", beat_fields=["open", "errors"])
    apply(tracker, "collective_start", seq=3, **BROADCAST)
    apply(tracker, "error", exc_type="RuntimeError", message="forged", fatal=True)
    assert tracker.error_unconfirmed and tracker.borne_calls() == ()
    apply(tracker, "heartbeat", open=None, errors=0)
    apply(tracker, "heartbeat", open=None, errors=0)
    assert tracker.error_t is None and tracker.contradicted is not None
    assert calls(tracker) == [] and tracker.disputed is not None


def test_an_error_the_ranks_own_node_contradicted_ends_nothing_on_another(tmp_path):
    """Rank 1 runs under node 1's launcher; node 0 reads it through node 1's summaries (its
    events while it is not routine, then rows again). The error appended to its file reaches
    node 0 as an event; node 1 (which reads every heartbeat) contradicts it, and the rows it
    then makes say so: node 0 never calls rank 1 failed, however long it waits."""
    from tests.unit.monitor.test_node_summaries import publish
    from tests.unit.monitor.test_rank_rows import rowed

    _run, clock, w, follower, lead, _seq = rowed(tmp_path)
    w.ev(1, "heartbeat", open=None, errors=0, cpu_s=6.0, frame="train.py:40 step")
    publish(follower, clock)
    lead.poll()
    w.ev(1, "error", exc_type="RuntimeError", message="forged: rank 1 failed", fatal=True)
    publish(follower, clock)
    assert lead.poll().ranks[1].state is not RankState.FAILED
    for i in range(3):
        clock.t += 1.0
        w.ev(1, "heartbeat", open=None, errors=0, cpu_s=7.0 + i, frame="train.py:40 step")
        publish(follower, clock)
        snap = lead.poll()
        assert snap.ranks[1].state is not RankState.FAILED, i
    clock.t += 60.0
    w.ev(1, "heartbeat", open=None, errors=0, cpu_s=20.0, frame="train.py:40 step")
    publish(follower, clock)
    snap = lead.poll()
    assert snap.ranks[1].state is not RankState.FAILED and snap.verdict is not Verdict.CRASH
    assert any(f.id == "run.forged_exit" for f in follower.poll().findings)


def test_a_clean_exit_after_an_error_nothing_bore_out_contradicts_it():
    tracker = RankTracker(1)
    apply(tracker, "hello", pid=42, host="h", beat_fields=["open", "errors"])
    apply(tracker, "error", exc_type="RuntimeError", message="forged", fatal=True)
    apply(tracker, "exit", code=0, reason="normal")
    assert tracker.error_t is None and tracker.exit_code == 0
    assert "then its process ended cleanly" in (tracker.contradicted or "")
    real = RankTracker(2)  # a real failure: the runtime exits 1 after its error
    apply(real, "hello", pid=43, host="h", beat_fields=["open", "errors"])
    apply(real, "error", exc_type="RuntimeError", message="boom", fatal=True)
    apply(real, "exit", code=1, reason="exception")
    assert real.error_t is not None and real.exit_code == 1 and real.contradicted is None
