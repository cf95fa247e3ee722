from __future__ import annotations

from ddpdoctor.monitor.judge.rules import crash
from ddpdoctor.monitor.model.snapshot import LogLine, RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, snap, view

TB = 'Traceback (most recent call last):\n  File "/job/train.py", line 10, in <module>\n    raise RuntimeError("boom")\nRuntimeError: boom\n'


def failed(rank, t, error, **kw):
    return view(rank, RankState.FAILED, error=error, failed_t=t, **kw)


def test_first_failure_is_the_root_cause_and_later_ones_are_consequences():
    ranks = [
        failed(0, NOW - 1.0, "RuntimeError: Connection closed by peer [127.0.0.1]:1234"),
        failed(
            1, NOW - 1.2, "RuntimeError: boom", traceback=TB, error_at=("events/rank-1.jsonl", 88)
        ),
    ]
    out = crash.detect(snap(ranks))
    assert out.verdict is Verdict.CRASH and out.culprits == {1}
    root, cons = out.findings
    assert root.id == "crash" and root.summary.startswith("rank 1 failed first")
    assert "RuntimeError: boom" in root.summary
    assert root.evidence[0].file == "events/rank-1.jsonl" and root.evidence[0].line == 88
    assert root.evidence[0].text == "rank 1: RuntimeError: boom"
    assert [e.text for e in root.evidence[1:]] == TB.splitlines()[1:]
    assert cons.id == "crash.consequence" and cons.ranks == (0,)
    assert "200 ms after rank 1" in cons.evidence[0].text
    assert out.started_t == NOW - 1.2


def test_a_consequence_message_never_wins_even_when_it_is_logged_first():
    ranks = [
        failed(0, NOW - 2.0, "RuntimeError: Connection reset by peer"),
        failed(1, NOW - 1.0, "ValueError: bad batch"),
    ]
    assert crash.detect(snap(ranks)).culprits == {1}


def test_vanished_rank_is_reported_as_died_with_its_signal_and_stderr():
    line = LogLine(
        "rank 1 stderr",
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        1,
        "error",
        "logs/vm/x/attempt_0/1/stderr.log",
        3,
    )
    ranks = [
        failed(0, NOW - 0.5, "RuntimeError: Connection closed by peer"),
        view(
            1,
            RankState.GONE,
            failed_t=NOW - 0.9,
            exit_code=-6,
            exit_signal="SIGABRT",
            error_lines=(line,),
        ),
    ]
    out = crash.detect(snap(ranks))
    died = out.findings[0]
    assert died.id == "died" and out.culprits == {1}
    assert "aborted (SIGABRT)" in died.summary and "(exit code -6)" in died.summary
    assert died.evidence[0].file.endswith("1/stderr.log") and died.evidence[0].line == 3


def test_sigkill_points_at_the_oom_killer():
    ranks = [
        view(0, RankState.GONE, failed_t=NOW - 1, exit_code=-9, exit_signal="SIGKILL"),
        view(1),
    ]
    died = crash.detect(snap(ranks)).findings[0]
    assert "SIGKILL" in died.summary and "dmesg" in died.fix


def test_exit_without_error_or_signal():
    ranks = [view(0, RankState.GONE, failed_t=NOW - 1, exit_code=1), view(1)]
    died = crash.detect(snap(ranks)).findings[0]
    assert "exited with code 1 without a Python error" in died.summary


def test_same_error_on_every_rank_blames_them_all():
    ranks = [failed(0, NOW - 1.0, "KeyError: 'x'"), failed(1, NOW - 0.9, "KeyError: 'x'")]
    out = crash.detect(snap(ranks))
    assert out.culprits == {0, 1} and len(out.findings) == 1


def test_sys_exit_code_is_reported():
    ranks = [
        view(0, RankState.FAILED, exit_code=3, failed_t=NOW - 1),
        view(1, RankState.DONE, exit_code=0),
    ]
    root = crash.detect(snap(ranks)).findings[0]
    assert "exited with code 3" in root.summary


def test_external_stop_is_a_crash_with_the_signal_named():
    ranks = [
        view(
            0,
            RankState.FAILED,
            exit_code=-15,
            exit_signal="SIGTERM",
            exit_reason="signal",
            failed_t=NOW - 1,
        )
    ]
    root = crash.detect(snap(ranks)).findings[0]
    assert "SIGTERM" in root.summary and "outside" in root.fix


def test_no_failure_no_crash():
    assert crash.detect(snap([view(0), view(1, RankState.DONE, exit_code=0)])) is None


def test_the_root_cause_names_the_users_line_it_raised_at():
    root = failed(
        0,
        NOW - 1.0,
        "RuntimeError: Found no NVIDIA driver on your system",
        error_line="gpu_published.py:17 in main",
        phase="init",
        step=0,
    )
    out = crash.detect(snap([root, failed(1, NOW - 0.5, "RuntimeError: boom")]))
    assert out.findings[0].summary == (
        "rank 0 failed first (in phase init, step 0): RuntimeError: Found no NVIDIA driver on "
        "your system at gpu_published.py:17 in main"
    )


def test_the_error_events_location_reaches_the_rank_view():
    from ddpdoctor.monitor.model.own_lines import error_event
    from ddpdoctor.monitor.model.rank_tracker import RankTracker

    tracker = RankTracker(0)
    error_event(
        tracker,
        {
            "exc_type": "RuntimeError",
            "message": "boom",
            "fatal": True,
            "location": {"file": "/home/u/train.py", "line": 17, "function": "main"},
        },
        NOW,
        ("events/rank-0.jsonl", 3),
    )
    assert tracker.error_line == "train.py:17 in main"
    error_event(tracker, {"exc_type": "RuntimeError", "fatal": True, "location": "odd"}, NOW, None)
    assert tracker.error_line is None


def test_a_rank_that_blames_a_peer_still_running_waits_for_that_peers_end():
    """Rank 1's "Connection closed by peer" comes a moment before rank 0's clean exit after
    fewer collectives is read: the crash is the verdict meanwhile, but not held until rank 0
    ends or PEER_FATE_WAIT_S passes (a rule that reads rank 0's end may then say more)."""
    blames = "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:11184"
    early = crash.detect(snap([view(0), failed(1, NOW - 0.4, blames)]))
    assert early.verdict is Verdict.CRASH and early.culprits == {1} and not early.confirmed
    late = crash.detect(
        snap([view(0, alive=None), failed(1, NOW - crash.PEER_FATE_WAIT_S - 0.1, blames)])
    )
    assert late.confirmed  # a peer not known alive (another host): 3 s
    alive = crash.detect(
        snap([view(0, alive=True), failed(1, NOW - crash.PEER_FATE_WAIT_S - 0.1, blames)])
    )
    assert not alive.confirmed  # its process still runs: its end is awaited
    late = crash.detect(
        snap([view(0, alive=True), failed(1, NOW - crash.PEER_ALIVE_WAIT_S - 0.1, blames)])
    )
    assert late.confirmed
    peer_done = crash.detect(snap([view(0, RankState.DONE, exit_code=0), failed(1, NOW, blames)]))
    assert peer_done.confirmed
    # an error of the rank's own is held at once, peers running or not
    assert crash.detect(snap([view(0), failed(1, NOW, "ValueError: bad batch")])).confirmed
