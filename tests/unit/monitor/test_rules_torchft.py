"""torchft's replica groups: a replica that dies and heals is recovery (a warning, no crash, no
stop); one that never comes back is a crash once the run is over; one that stalls in its own
code is a hang of its group. The events are the runtime's (ddpdoctor.protocol.replica_groups)."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import torchft, torchft_stall
from ddpdoctor.monitor.model.attempts import ending_of
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.replica_groups import Heal, ReplicaEnding, ReplicaLog, TorchftView
from ddpdoctor.monitor.model.snapshot import Activity, RankState, RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.verdicts import ActivityState
from tests.unit.monitor.test_monitor_builders import NOW, snap, thresholds, view


def tf_view(*endings: ReplicaEnding, heals: tuple[Heal, ...] = ()) -> TorchftView:
    return TorchftView(
        groups=((0, 0), (1, 1)), endings=endings, heals=heals, quorum_id=3, quorum_groups=(0, 1)
    )


KILLED = ReplicaEnding(1, 1, 4242, NOW - 30, 10, exit_code=-9, signal="SIGKILL")
HEALED = Heal(1, NOW - 10, 0, 27, True)


def gone(rank: int = 1, **kw):
    kw.setdefault("exit_code", -9)
    kw.setdefault("exit_signal", "SIGKILL")
    return view(rank, RankState.GONE, failed_t=NOW - 2, **kw)


# -- the model: ReplicaLog ----------------------------------------------------------------------


def hello(rank: int, pid: int, group: int) -> dict:
    return {"rank": rank, "kind": "hello", "pid": pid, "torchft": {"replica_group": group}}


def test_a_new_process_of_a_torchft_rank_keeps_how_the_old_one_ended():
    """How the old process ended is the attempts model's (the same ending as any restart's);
    the replica log adds its group, and the signal torchrun's log gives its pid later."""
    log, tracker = ReplicaLog(), RankTracker(1)
    log.on_hello(hello(1, 100, 1), None)
    tracker.pid, tracker.step, tracker.last_event_t = 100, 10, 5.0
    log.on_hello(hello(1, 200, 1), ending_of(tracker, None, False))
    log.on_event({"rank": 1, "what": "quorum", "quorum_id": 4, "replica_groups": [0, 1],
                  "heal_from": 0, "heal_from_group": 0, "max_step": 27}, 6.0)  # fmt: skip
    log.on_event({"rank": 1, "what": "healed", "step": 27}, 6.5)
    tf = log.view(lambda pid: (-9, "SIGKILL") if pid == 100 else None)
    assert tf is not None and tf.group_of(1) == 1 and tf.quorum_id == 4
    (ending,) = tf.endings
    assert (ending.pid, ending.step, ending.signal, ending.failed) == (100, 10, "SIGKILL", True)
    assert ending.cause == "killed by SIGKILL"
    heal = tf.heal_after(1, ending.t)
    assert heal is not None and heal.done and heal.from_group == 0 and heal.step == 27


def test_ranks_that_are_not_torchft_s_leave_no_log():
    log, tracker = ReplicaLog(), RankTracker(0)
    tracker.pid = 100
    log.on_hello({"rank": 0, "kind": "hello", "pid": 200}, ending_of(tracker, None, False))
    assert log.view() is None and not log.endings


def test_the_run_state_gives_the_replica_log_the_attempts_ending():
    """One idea of a restart: a torchft rank's new process is the next attempt of the rank, and
    the replica log's ending is the one the attempts model recorded (its error and line)."""
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2))
    for rank in (0, 1):
        state.apply({"v": 1, "t": NOW, **hello(rank, 100 + rank, rank)})
    state.apply({"v": 1, "t": NOW + 1, "rank": 1, "kind": "step", "step": 10})
    state.apply({"v": 1, "t": NOW + 2, "rank": 1, "kind": "error", "exc_type": "AssertionError",
                 "message": "bad batch", "location": "train.py:41 in step"})  # fmt: skip
    state.apply({"v": 1, "t": NOW + 9, **hello(1, 300, 1), "restart_count": 1})
    (ending,) = state.replicas.endings
    (recorded,) = state.attempts.endings[0]
    assert ending == ReplicaEnding.of(recorded, 1)
    assert ending.failed and ending.error and "AssertionError" in ending.cause and ending.step == 10


# -- recovery ------------------------------------------------------------------------------------


def test_a_replica_that_died_while_the_run_goes_on_is_recovering_not_a_crash():
    ranks = [view(0), gone(1)]
    diag = diagnose(snap(ranks, torchft=tf_view()))
    assert diag.verdict is not Verdict.CRASH and not diag.confirmed
    (finding,) = [f for f in diag.findings if f.id == "torchft.replica_failed"]
    assert finding.severity is Severity.WARNING and finding.ranks == (1,)
    assert "replica group 1" in finding.summary and "SIGKILL" in finding.summary
    assert "goes on with replica group 0" in finding.summary
    assert not [f for f in diag.findings if f.severity is Severity.ERROR]


def test_the_same_death_without_torchft_is_a_crash():
    diag = diagnose(snap([view(0), gone(1)]))
    assert diag.verdict is Verdict.CRASH and diag.culprits == {1}


def test_a_replica_that_never_came_back_is_a_crash_once_the_run_is_over():
    ranks = [view(0, RankState.DONE, exit_code=0), gone(1)]
    diag = diagnose(snap(ranks, torchft=tf_view(), live=False, finished=True))
    assert diag.verdict is Verdict.CRASH and diag.culprits == {1}


def test_a_replica_that_died_and_healed_leaves_a_healthy_run_with_a_warning():
    ranks = [view(0, RankState.DONE, exit_code=0), view(1, RankState.DONE, exit_code=0)]
    s = snap(ranks, torchft=tf_view(KILLED, heals=(HEALED,)), live=False, finished=True,
             verdict=Verdict.HEALTHY)  # fmt: skip
    diag = diagnose(s)
    assert diag.verdict is Verdict.HEALTHY
    (finding,) = [f for f in diag.findings if f.id == "torchft.replica_recovered"]
    assert finding.severity is Severity.WARNING and finding.ranks == (1,)
    for words in (
        "rank 1 (replica group 1)",
        "after 10 steps",
        "SIGKILL",
        "healed from replica group 0 at torchft step 27",
    ):
        assert words in finding.summary


def test_torchrun_s_report_of_a_recovered_replica_is_information():
    report = Finding(
        "torchrun.killed",
        Severity.ERROR,
        "Rank 0 (pid 4242) was killed by SIGKILL: the kernel OOM killer or an external `kill -9`",
        "fix",
        ranks=(0,),
    )
    peer = Finding("gloo.peer_closed", Severity.WARNING, "A gloo peer closed", "fix")
    raised = Finding("python.exception", Severity.ERROR, "A process raised AssertionError: ", "")
    other = Finding("python.exception", Severity.ERROR, "A process raised KeyError: 'x'", "")
    assertion = ReplicaEnding(0, 0, 4343, NOW - 30, 9, exit_code=1, error="AssertionError: ")
    s = snap([view(0), view(1)], torchft=tf_view(KILLED, assertion))
    weighed = torchft.weigh([report, peer, raised, other], s, frozenset())
    severities = [f.severity for f in weighed]
    assert severities == [Severity.INFO, Severity.INFO, Severity.INFO, Severity.ERROR]
    assert weighed[0].ranks == (1,) and "replica group 1" in weighed[0].summary
    plain = snap([view(0), view(1)])
    assert torchft.weigh([report], plain, frozenset()) == [report]


def test_what_torchft_raised_and_waited_for_inside_itself_is_information_once_it_recovered():
    """Under load the surviving replica's torchft code raised and waited too, as its peer died
    (the logs of a real run of the corpus); a user's own code raising is still an error, also
    in a script kept under a directory named torchft."""
    inside = Finding(
        "python.exception", Severity.ERROR, "A process raised AssertionError: process group "
        "not initialized at /venv/lib/python3.11/site-packages/torchft/manager.py:468 in "
        "allreduce", "",
    )  # fmt: skip
    store = Finding(
        "c10d.store_wait_timeout", Severity.ERROR, "This rank waited 10000 ms for store keys "
        "(/torchft/10/0/0/1) that another rank should have written", "",
    )  # fmt: skip
    users = Finding(
        "python.exception", Severity.ERROR, "A process raised KeyError: 'x' at "
        "/home/me/torchft/train.py:12 in main", "",
    )  # fmt: skip
    recovered = snap([view(0), view(1)], torchft=tf_view(KILLED))
    weighed = torchft.weigh([inside, store, users], recovered, frozenset())
    assert [f.severity for f in weighed] == [Severity.INFO, Severity.INFO, Severity.ERROR]
    assert "inside torchft" in weighed[0].summary
    # no replica failed: nothing to excuse
    assert torchft.weigh(
        [inside, store], snap([view(0), view(1)], torchft=tf_view()), frozenset()
    ) == [inside, store]


# -- a stalled replica -----------------------------------------------------------------------------


def blocked(rank: int, frame: str, where: str, quiet: float = 20.0, since=None, **kw):
    """A rank quiet for `quiet` s, blocked for `since` s of it (all of it unless given)."""
    since = quiet if since is None else since
    activity = Activity(ActivityState.BLOCKED, 0.0, where, since, frame=frame)
    return view(rank, activity=activity, last_progress_t=NOW - quiet, **kw)


def test_a_replica_blocked_in_its_own_code_is_a_hang_of_its_group():
    ranks = [view(0), blocked(1, "train.py:55 main", "train.py:55 main")]
    out = torchft_stall.detect(snap(ranks, torchft=tf_view()))
    assert out is not None and out.verdict is Verdict.HANG and out.culprits == {1}
    assert out.confirmed
    (finding,) = out.findings
    assert "replica group 1" in finding.summary and "train.py:55" in finding.summary
    diag = diagnose(snap(ranks, torchft=tf_view()))
    assert diag.verdict is Verdict.HANG and diag.culprits == {1}


def test_a_replica_waiting_for_a_quorum_or_starting_up_is_no_culprit():
    quorum = blocked(1, "threading.py:331 wait", "train.py:50 main")
    assert torchft_stall.detect(snap([view(0), quorum], torchft=tf_view())) is None
    fresh = blocked(1, "train.py:55 main", "train.py:55 main", step=0, collectives_done=0)
    assert torchft_stall.detect(snap([view(0), fresh], torchft=tf_view())) is None
    brief = blocked(1, "train.py:55 main", "train.py:55 main", quiet=2.0)
    assert torchft_stall.detect(snap([view(0), brief], torchft=tf_view())) is None
    plain = blocked(1, "train.py:55 main", "train.py:55 main")
    assert torchft_stall.detect(snap([view(0), plain])) is None  # not a torchft run


def _soon(ranks, **kw):
    """hang_after 5 s, hang_blocked_after 2.5 s, one heartbeat a second."""
    th = replace(thresholds(5.0), hang_blocked_after_s=2.5, heartbeat_period_s=1.0)
    return replace(snap(ranks, torchft=tf_view(), **kw), thresholds=th)


def _threshold_line(out) -> str:
    (line,) = [e.text for e in out.findings[0].evidence if e.text.startswith("threshold")]
    return line


def test_a_replica_blocked_all_along_is_stalled_at_the_sooner_threshold():
    stuck = blocked(1, "train.py:55 main", "train.py:55 main", quiet=3.0)
    out = torchft_stall.detect(_soon([view(0), stuck]))
    assert out is not None and out.verdict is Verdict.HANG and out.culprits == {1}
    assert out.confirmed and out.started_t == NOW - 3.0
    assert out.onset_t == NOW - 3.0 + 2.5
    assert _threshold_line(out).startswith("threshold 2.5 s, rank 1 blocked (")
    diag = diagnose(_soon([view(0), stuck]))
    assert diag.verdict is Verdict.HANG and diag.culprits == {1} and diag.confirmed


def test_a_replica_blocked_for_less_than_its_quiet_time_takes_the_full_threshold():
    # quiet for 3 s, blocked for the last second of them: it was doing something before
    late = blocked(1, "train.py:55 main", "train.py:55 main", quiet=3.0, since=1.0)
    assert torchft_stall.detect(_soon([view(0), late])) is None
    longer = blocked(1, "train.py:55 main", "train.py:55 main", quiet=5.5, since=1.0)
    out = torchft_stall.detect(_soon([view(0), longer]))
    assert out is not None and out.culprits == {1}
    assert out.onset_t == NOW - 5.5 + 5.0
    assert _threshold_line(out) == "threshold 5.0 s (test)"
    # each culprit by its own threshold (rank 0 blocked all along): the first to pass its own
    stuck = blocked(0, "train.py:55 main", "train.py:55 main", quiet=2.8)
    out = torchft_stall.detect(_soon([stuck, longer]))
    assert out is not None and out.culprits == {0, 1}
    assert out.started_t == NOW - 5.5 and out.onset_t == NOW - 5.5 + 5.0
    assert _threshold_line(out) == "threshold 5.0 s (test)"
    stuck = blocked(0, "train.py:55 main", "train.py:55 main", quiet=4.0)
    out = torchft_stall.detect(_soon([stuck, longer]))
    assert out is not None and out.onset_t == NOW - 4.0 + 2.5
    assert _threshold_line(out).startswith("threshold 2.5 s, rank 0 blocked (")


def test_a_replica_groups_restart_is_told_once_and_is_no_attempt_of_the_run():
    """A replica group's torchrun restarts its rank (restart_count 1 of max_restarts 1): the
    torchft rule tells it; the run is not in "attempt 2 of 2" and has no run.recovered."""
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2))
    budget = {"restart_count": 0, "max_restarts": 1}
    for rank in (0, 1):
        state.apply({"v": 1, "t": NOW, **hello(rank, 100 + rank, rank), **budget})
        state.apply({"v": 1, "t": NOW + 1, "rank": rank, "kind": "step", "step": 10})
    state.apply({"v": 1, "t": NOW + 9, **hello(1, 300, 1), **budget, "restart_count": 1})
    for rank in (0, 1):
        state.apply({"v": 1, "t": NOW + 10, "rank": rank, "kind": "exit", "code": 0})
    s = state.snapshot(NOW + 11, live=False)
    assert s.attempts is None and [v.restarts for v in s.ranks] == [0, 1]
    diag = diagnose(s)
    assert diag.verdict is Verdict.HEALTHY
    assert [f.id for f in diag.findings if f.severity is not Severity.INFO] == [
        "torchft.replica_recovered"
    ]
