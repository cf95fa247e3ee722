"""The trust boundary (ddpdoctor.protocol.trust): a torchrun failure table only explains a rank's
end ddpdoctor observed; printed by the job (a user's command's output), or naming a process that
runs, it never ends a rank, sets a verdict or stops the job."""

from __future__ import annotations

import pytest

from ddpdoctor.monitor.model.snapshot import RankState, RunInfo, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.protocol.torchrun_logs import classify_log_path
from ddpdoctor.protocol.trust import Origin, agent_log_origin, report_may_end_rank
from tests.unit.monitor.test_monitor_builders import NOW, Stream
from tests.unit.protocol.test_torchrun_logs import TABLE

# The table names rank 1 (pid 8482) killed by SIGKILL and rank 0 (pid 8481) stopped by SIGTERM.
AGENT = classify_log_path(("logs", "vm", "torchrun.log"))


def state_with_table(launch_mode: str | None, alive: dict[int, bool | None]) -> RunState:
    s = Stream()
    s.hello(host="vm")
    s.events[0][0]["pid"], s.events[1][0]["pid"] = 8481, 8482
    t = s.steps(3)
    info = RunInfo(name="t", run_dir="/x", world_size=2, nnodes=1, launch_mode=launch_mode)
    state = RunState(info)
    for event in sorted((e for evs in s.events.values() for e in evs), key=lambda e: e["t"]):
        state.apply(event)
    for rank, value in alive.items():
        state.set_alive(rank, value)
    state.apply_log_lines(AGENT, list(enumerate(TABLE.splitlines(), 1)))
    state.last_t = NOW + t
    return state


@pytest.mark.parametrize("launch_mode", ["command", "torchrun", None])
def test_a_table_naming_running_processes_ends_no_rank(launch_mode):
    """ddpdoctor sees both pids alive: the text, whoever wrote it, changes nothing."""
    snap = state_with_table(launch_mode, {0: True, 1: True}).snapshot(NOW + 4.0)
    assert [v.state.finished for v in snap.ranks] == [False, False]
    assert all(v.exit_code is None and v.exit_signal is None for v in snap.ranks)
    assert snap.verdict is Verdict.RUNNING


def test_a_commands_output_ends_no_rank_whose_process_cannot_be_seen():
    """A rank on another host (alive unknown): the command's output is the job's text."""
    snap = state_with_table("command", {0: None, 1: None}).snapshot(NOW + 4.0)
    assert not any(v.state.finished for v in snap.ranks)


def test_ddpdoctors_torchruns_own_stream_stands_in_where_nothing_can_be_seen():
    snap = state_with_table("torchrun", {0: None, 1: None}).snapshot(NOW + 4.0)
    assert snap.ranks[1].state is RankState.GONE and snap.ranks[1].exit_signal == "SIGKILL"


@pytest.mark.parametrize("launch_mode", ["command", "torchrun"])
def test_the_table_explains_an_end_ddpdoctor_saw(launch_mode):
    """Rank 1's process is gone (ddpdoctor looked): the table says how it ended."""
    snap = state_with_table(launch_mode, {0: True, 1: False}).snapshot(NOW + 4.0)
    assert snap.ranks[1].state is RankState.GONE
    assert (snap.ranks[1].exit_code, snap.ranks[1].exit_signal) == (-9, "SIGKILL")
    assert not snap.ranks[0].state.finished


def test_a_post_mortem_reads_every_exit_from_the_table():
    snap = state_with_table("command", {}).snapshot(NOW + 4.0, live=False)
    assert snap.ranks[1].exit_signal == "SIGKILL"


def test_a_rank_that_finished_cleanly_stays_done_whatever_the_text_said():
    state = state_with_table("command", {0: True, 1: True})
    for rank in (0, 1):
        state.apply({"v": 1, "t": NOW + 5, "rank": rank, "kind": "exit", "code": 0})
    snap = state.snapshot(NOW + 5.5)
    assert [v.state for v in snap.ranks] == [RankState.DONE, RankState.DONE]
    assert snap.verdict is Verdict.HEALTHY


def test_origins():
    assert agent_log_origin("command") is Origin.JOB
    assert agent_log_origin("torchrun") is agent_log_origin(None) is Origin.LAUNCHER
    assert report_may_end_rank(Origin.OBSERVED, alive=True, live=True)
    assert not report_may_end_rank(Origin.LAUNCHER, alive=True, live=True)
    assert not report_may_end_rank(Origin.JOB, alive=None, live=True)
    assert report_may_end_rank(Origin.JOB, alive=False, live=True)
    assert report_may_end_rank(Origin.JOB, alive=True, live=False)


def test_a_printed_report_of_a_rank_that_finished_cleanly_is_information_not_an_error():
    """In a healthy run, a table a rank printed (the explainers read it in its log) no longer
    leaves a `torchrun.killed` error: ddpdoctor saw rank 1 finish with code 0."""
    from ddpdoctor.explain import explain_lines
    from ddpdoctor.findings import Severity
    from ddpdoctor.monitor.judge.diagnose import diagnose

    printed = explain_lines(TABLE.splitlines(), "logs/vm/x/attempt_0/0/stdout.log")
    killed = next(f for f in printed if f.id == "torchrun.killed")
    assert killed.severity is Severity.ERROR and killed.ranks == (1,)
    state = state_with_table("torchrun", {0: True, 1: True})
    for rank in (0, 1):
        state.apply({"v": 1, "t": NOW + 5, "rank": rank, "kind": "exit", "code": 0})
    snap = state.snapshot(NOW + 5.5)
    found = diagnose(snap, extra_findings=printed)
    assert found.verdict is Verdict.HEALTHY
    weighed = next(f for f in found.findings if f.id == "torchrun.killed")
    assert weighed.severity is Severity.INFO and weighed.summary.startswith("not acted on")
    assert "rank 1 finish normally" in weighed.summary
    assert not any(f.severity is Severity.ERROR for f in found.findings)


GUARD_TRACEBACK = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 88, in _run_code
  File "/opt/ddpdoctor/launch/job_guard.py", line 120, in main
    signal.signal(-code, signal.SIG_DFL)
  File "/usr/lib/python3.11/signal.py", line 56, in signal
    handler = _signal.signal(_enum_to_int(signalnum), _enum_to_int(handler))
OSError: [Errno 22] Invalid argument"""


def test_an_exception_of_ddpdoctors_own_launch_code_is_not_the_jobs():
    from ddpdoctor.explain import explain_lines
    from ddpdoctor.findings import Severity
    from ddpdoctor.monitor.judge.diagnose import diagnose

    printed = explain_lines(GUARD_TRACEBACK.splitlines(), "logs/vm/torchrun.log")
    assert [f.id for f in printed] == ["python.exception"]
    state = state_with_table("command", {0: True, 1: True})
    found = diagnose(state.snapshot(NOW + 4.0), extra_findings=printed)
    assert [f.id for f in found.findings] == ["ddpdoctor.internal"]
    internal = found.findings[0]
    assert internal.severity is Severity.WARNING and "not your job" in internal.summary
    user_error = explain_lines(
        GUARD_TRACEBACK.replace(
            "/opt/ddpdoctor/launch/job_guard.py", "/home/me/train.py"
        ).splitlines(),
        "logs/vm/torchrun.log",
    )
    kept = diagnose(state.snapshot(NOW + 4.0), extra_findings=user_error).findings
    assert [f.id for f in kept] == ["python.exception"]
