"""How a run ends: the exit code, the closing lines, and the --json document."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.launch.closing import (
    RunOutcome,
    closing_lines,
    exit_code_for,
    json_document,
    rank_exit_lines,
    verdict_agrees,
)
from ddpdoctor.monitor.model.snapshot import RankState, RankView, RunInfo, Snapshot, Verdict
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.torchrun_logs import AgentExit


def snap(verdict=Verdict.HEALTHY, ranks=()) -> Snapshot:
    return Snapshot(
        run=RunInfo(name="r", run_dir="/tmp/r"), taken_t=0.0, ranks=tuple(ranks), verdict=verdict
    )


def outcome(verdict=Verdict.HEALTHY, rc=0, stopped=None, interrupted=False, ranks=()):
    return RunOutcome(
        final=snap(verdict, ranks),
        job_returncode=rc,
        stopped_for=stopped,
        interrupted=interrupted,
    )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (outcome(), ExitCode.OK),
        (outcome(rc=1), ExitCode.PROBLEMS),
        (outcome(Verdict.CRASH, rc=1), ExitCode.PROBLEMS),
        (outcome(Verdict.MISMATCH, rc=0), ExitCode.PROBLEMS),
        (outcome(Verdict.HANG, rc=-15, stopped=Verdict.HANG), ExitCode.PROBLEMS),
        (outcome(Verdict.RUNNING, rc=None), ExitCode.OK),
        (outcome(Verdict.HANG, rc=1, interrupted=True), ExitCode.INTERRUPTED),
    ],
)
def test_exit_code_contract(case, expected):
    assert exit_code_for(case) == expected


def test_rank_exits_from_events_then_from_torchruns_table():
    ranks = [
        RankView(rank=0, state=RankState.FAILED, exit_code=3),
        RankView(rank=1, state=RankState.FAILED, exit_code=-6),
        RankView(rank=2, state=RankState.GONE),
        RankView(rank=3, state=RankState.DONE, exit_code=0),
        RankView(rank=4, state=RankState.GONE, exit_signal="SIGKILL"),
        RankView(rank=5, state=RankState.RUNNING),
    ]
    agent = {
        100: AgentExit(rank=5, local_rank=5, exit_code=17, pid=100),
        101: AgentExit(rank=0, local_rank=0, exit_code=3, pid=101),  # already known
        102: AgentExit(rank=None, local_rank=6, exit_code=1, pid=102),  # rank unknown: skipped
    }
    assert rank_exit_lines(snap(Verdict.CRASH, ranks), agent) == [
        "rank 0 exited with code 3",
        "rank 1 ended by SIGABRT",
        "rank 2 died without an exit event",
        "rank 4 died without an exit event (SIGKILL)",
        "rank 5 exited with code 17 (torchrun)",
    ]


def test_closing_lines_name_the_run_directory_and_the_verdict(tmp_path):
    run = RunDir(tmp_path / "run")
    lines = closing_lines(
        outcome(Verdict.HANG, rc=1, stopped=Verdict.HANG), {}, run_dir=run, exit_code=ExitCode(1)
    )
    assert lines == [
        "ddpdoctor stopped the job after diagnosing a hang",
        f"run directory: {run.path}",
        "verdict: hang (exit code 1)",
    ]
    failed = closing_lines(outcome(Verdict.RUNNING, rc=2), {}, run_dir=run, exit_code=ExitCode(1))
    assert failed[0] == "torchrun exited with code 2"
    interrupted = closing_lines(
        outcome(Verdict.RUNNING, rc=1, interrupted=True), {}, run_dir=run, exit_code=ExitCode(130)
    )
    assert interrupted[0] == "interrupted: the job was stopped"
    assert interrupted[-1] == "verdict: running (exit code 130)"


def test_json_document_is_the_diagnosis_plus_the_job():
    ranks = [RankView(rank=0, state=RankState.FAILED, exit_code=3)]
    doc = json_document(outcome(Verdict.CRASH, rc=1, ranks=ranks), {}, ExitCode.PROBLEMS)
    assert doc["verdict"] == "crash" and doc["schema_version"] == 1
    assert doc["job"] == {
        "exit_code": 1,
        "started": True,
        "torchrun_exit_code": 1,
        "stopped_for": None,
        "interrupted": False,
        "abandoned_by_node": None,
        "nodes_missing": [],
        "rank_exits": ["rank 0 exited with code 3"],
    }


def test_a_node_that_never_joined_means_not_started():
    from dataclasses import replace

    never = replace(snap(Verdict.RUNNING), nodes_missing=(1,), live=False)
    case = RunOutcome(final=never, job_returncode=1, stopped_for=None, interrupted=False)
    assert not case.started and exit_code_for(case) == ExitCode.PROBLEMS
    lines = closing_lines(case, {}, run_dir=RunDir("/tmp/r"), exit_code=ExitCode.PROBLEMS)
    assert lines[0].startswith("node 1 never joined the rendezvous, so torchrun started no rank")
    assert lines[-1] == "verdict: not started (exit code 1)"
    doc = json_document(case, {}, ExitCode.PROBLEMS)
    assert doc["job"]["started"] is False and doc["job"]["nodes_missing"] == [1]
    assert doc["nodes_missing"] == [1]
    # while the run is live, the node is still awaited: the job has not failed to start
    waiting = replace(never, live=True)
    assert RunOutcome(
        final=waiting, job_returncode=None, stopped_for=None, interrupted=False
    ).started


def test_torchruns_table_never_contradicts_what_ddpdoctor_saw():
    """A job can print a torchrun-style table: a rank that finished cleanly or still runs is not
    "ended by SIGKILL" in the closing lines, and in a user's command's output (the job's text) a
    rank ddpdoctor never saw is not named at all."""
    ranks = [
        RankView(rank=0, state=RankState.DONE, exit_code=0),
        RankView(rank=1, state=RankState.RUNNING, alive=True),
    ]
    agent = {
        100: AgentExit(rank=0, local_rank=0, exit_code=-9, pid=100),
        101: AgentExit(rank=1, local_rank=1, exit_code=-9, pid=101),
        102: AgentExit(rank=2, local_rank=2, exit_code=-9, pid=102),
    }
    final = snap(Verdict.HEALTHY, ranks)
    assert rank_exit_lines(final, agent) == ["rank 2 ended by SIGKILL (torchrun)"]
    command = replace(final, run=replace(final.run, launch_mode="command"))
    assert rank_exit_lines(command, agent) == []


VERDICT_CASES = [
    (verdict, rc, stopped, interrupted)
    for verdict in Verdict
    for rc in (0, 1, -6, -15, None)
    for stopped in (None, Verdict.HANG)
    for interrupted in (False, True)
    if verdict is not Verdict.RUNNING
    # the monitor never leaves these (monitor/run_end.py: a launcher that failed or was
    # stopped is never "healthy"); see test_monitor_stop / test_monitor_ended_runs
    and not (verdict is Verdict.HEALTHY and rc not in (0, None))
    and not (stopped is not None and not verdict.is_problem)
]


@pytest.mark.parametrize(("verdict", "rc", "stopped", "interrupted"), VERDICT_CASES)
def test_the_printed_verdict_and_the_exit_code_never_contradict(verdict, rc, stopped, interrupted):
    case = outcome(verdict, rc=rc, stopped=stopped, interrupted=interrupted)
    code = exit_code_for(case)
    if interrupted:  # the user stopped ddpdoctor: 130, whatever the verdict
        assert code == ExitCode.INTERRUPTED
        return
    assert verdict_agrees(verdict, code, rc), (verdict, rc, code)
    lines = closing_lines(case, {}, run_dir=RunDir("/tmp/r"), exit_code=code)
    assert lines[-1].endswith(f"(exit code {int(code)})")


def test_a_command_that_ran_without_ranks_keeps_its_exit_code():
    for verdict in (Verdict.NOT_DISTRIBUTED, Verdict.NOT_INSTRUMENTED):
        ok = outcome(verdict, rc=0)
        assert exit_code_for(ok) == ExitCode.OK and ok.started
        lines = closing_lines(ok, {}, run_dir=RunDir("/tmp/r"), exit_code=ExitCode.OK)
        assert lines[0] == "torchrun exited with code 0"
        assert lines[-1] == f"verdict: {verdict.value.replace('_', ' ')} (exit code 0)"
        assert exit_code_for(outcome(verdict, rc=3)) == 3  # its own code, not ddpdoctor's 1
        assert exit_code_for(outcome(verdict, rc=-15)) == 128 + 15  # as a shell says SIGTERM
        lines = closing_lines(outcome(verdict, rc=3), {}, run_dir=RunDir("/tmp/r"), exit_code=3)
        assert lines[0] == "torchrun exited with code 3" and lines[-1].endswith("(exit code 3)")


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "-m", "torch.distributed.run", "t.py"], "torchrun"),
        (["/usr/bin/python3", "spawn_job.py", "2"], "python3 spawn_job.py"),
        (["python", "-m", "pkg.train"], "python -m pkg.train"),
        (["accelerate", "launch", "--cpu", "t.py"], "accelerate launch"),
    ],
)
def test_the_launcher_is_named_as_the_user_gave_it(argv, name):
    from types import SimpleNamespace

    from ddpdoctor.launch.command import UserCommand, program_kind
    from ddpdoctor.launch.launcher import launcher_name

    command = UserCommand("command", tuple(argv), program_kind(argv))
    assert launcher_name(SimpleNamespace(command=command)) == name
