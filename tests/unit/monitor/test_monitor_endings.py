"""How a run that ended without a problem found says so: a command that ran without joining a
process group, one ddpdoctor could not load into, a launcher stopped or killed from outside."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.judge.uninstrumented import cannot_load
from ddpdoctor.monitor.model.snapshot import Verdict
from ddpdoctor.protocol import processes
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, new_run, train


def command_run(tmp_path, job_command) -> RunDir:
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(
        json.dumps({"launch_mode": "command", "job_command": job_command, "world_size": None})
    )
    return run


def ended(run: RunDir, **kw):
    return Monitor(run, capture_stacks=False, explain_logs=False).close(job_ended=True, **kw)


def test_a_command_whose_process_never_joined_is_not_distributed(tmp_path):
    """accelerate launch --cpu --num_processes 2: one process, no process group, exit 0."""
    run = command_run(tmp_path, ["accelerate", "launch", "--cpu", "train.py"])
    processes.append(run.path, {"argv": ["train.py"], "joined": False, "error": None})
    snap = ended(run, job_exit=0)
    assert snap.verdict is Verdict.NOT_DISTRIBUTED and not snap.verdict.is_problem
    assert snap.findings[0].id == "run.not_distributed"
    assert "ran 1 process that never joined a process group" in snap.findings[0].summary
    assert json.loads(run.diagnosis_json.read_text())["verdict"] == "not_distributed"


def test_a_process_that_could_not_load_the_runtime_says_why(tmp_path):
    run = command_run(tmp_path, ["/usr/bin/python3", "train.py"])
    processes.append(run.path, {"argv": ["train.py"], "load_error": "ModuleNotFoundError: x"})
    snap = ended(run, job_exit=0)
    assert snap.verdict is Verdict.NOT_INSTRUMENTED
    assert snap.findings[0].summary.endswith("ModuleNotFoundError: x")


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["python", "-I", "train.py"], "python -I (isolated mode) ignores PYTHONPATH"),
        (["python3.12", "-u", "-E", "train.py"], "python -E ignores PYTHONPATH"),
        (["/usr/bin/python", "-sS", "train.py"], "python -S skips the site module"),
        (["./a.out"], "a.out is not a Python program"),
    ],
)
def test_commands_that_cannot_load_the_runtime(tmp_path, argv, why):
    assert why in (cannot_load(argv) or "")
    snap = ended(command_run(tmp_path, argv), job_exit=0)
    assert snap.verdict is Verdict.NOT_INSTRUMENTED
    assert snap.findings[0].summary.startswith("the runtime could not load in this process: ")


@pytest.mark.parametrize(
    "argv",
    [["python", "-u", "train.py"], ["python", "-W", "ignore", "train.py"], ["torchrun", "t.py"],
     ["srun", "python", "t.py"], ["bash", "job.sh"], ["env", "python", "t.py"]],
)  # fmt: skip
def test_commands_that_load_it_are_still_not_started_without_a_record(tmp_path, argv):
    assert cannot_load(argv) is None
    assert ended(command_run(tmp_path, argv), job_exit=1).verdict is Verdict.NOT_STARTED


def test_ddpdoctors_own_torchrun_without_a_rank_is_not_started(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(json.dumps({"launch_mode": "torchrun", "world_size": 2}))
    processes.append(run.path, {"argv": ["train.py"], "joined": False})
    assert ended(run, job_exit=1).verdict is Verdict.NOT_STARTED


def finished_training(tmp_path, steps=5):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    train(w, clock, steps)
    return run, clock, w


def test_a_rank_that_died_after_its_clean_exit_is_not_healthy(tmp_path):
    """mp.spawn: rank 0 recorded exit 0, then died of SIGABRT in interpreter teardown; the
    parent raised ProcessExitedException and exited 1. Never "healthy (exit code 1)"."""
    run, clock, w = finished_training(tmp_path)
    for rank in (0, 1):
        w.ev(rank, "exit", code=0, reason="normal")
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    assert monitor.poll().verdict is Verdict.HEALTHY
    snap = monitor.close(job_ended=True, job_exit=1, launcher="python spawn_job.py")
    assert snap.verdict is Verdict.CRASH and not snap.confirmed
    assert snap.findings[0].id == "run.launcher_failed"
    assert "the launcher (python spawn_job.py) exited with code 1" in snap.findings[0].summary


def test_a_launcher_killed_by_sigterm_is_an_interrupted_run_not_a_healthy_one(tmp_path):
    """SIGTERM to an mp.spawn parent: torch's children swallow the parent-death SIGINT and exit
    0 at step 5 of 2000, the parent dies of SIGTERM."""
    run, clock, w = finished_training(tmp_path)
    for rank in (0, 1):
        w.ev(rank, "exit", code=0, reason="normal")
    snap = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close(
        job_ended=True, job_exit=-15, launcher="python spawn_job.py"
    )
    assert snap.verdict is Verdict.INTERRUPTED and not snap.culprits
    assert snap.findings[0].summary == (
        "the launcher (python spawn_job.py) was ended by SIGTERM from outside ddpdoctor; "
        "the ranks stopped at step 5"
    )


def test_ranks_all_stopped_by_sigterm_blame_no_rank(tmp_path):
    """SIGTERM to the user's torchrun: it passes the signal to every rank. Nothing crashed: the
    job was stopped from outside (run or watch alike)."""
    run, clock, w = finished_training(tmp_path)
    for rank in (0, 1):
        w.ev(rank, "exit", code=-15, reason="signal", signal="SIGTERM")
        clock.t += 0.1
    for kw in ({"job_exit": 1, "launcher": "torchrun"}, {}):
        snap = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close(
            job_ended=bool(kw), **kw
        )
        assert snap.verdict is Verdict.INTERRUPTED and not snap.culprits, kw
        assert snap.findings[0].id == "run.launcher_stopped"
        assert "ended by SIGTERM from outside ddpdoctor" in snap.findings[0].summary


def test_a_spawn_parents_report_names_the_rank_that_died_after_its_exit(tmp_path):
    from dataclasses import replace

    from ddpdoctor.findings import Finding, Severity
    from ddpdoctor.monitor.judge.run_end import launcher_exit_snapshot

    run, clock, w = finished_training(tmp_path)
    for rank in (0, 1):
        w.ev(rank, "exit", code=0, reason="normal")
    snap = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).poll()
    report = Finding(
        "python.exception",
        Severity.ERROR,
        "A process raised ProcessExitedException: process 0 terminated with signal SIGABRT",
        "",
    )
    snap = launcher_exit_snapshot(replace(snap, findings=(report,)), 1, "python job.py")
    assert snap.verdict is Verdict.CRASH and snap.culprits == {0}
    assert snap.findings[0].summary.startswith(
        "the launcher (python job.py) exited with code 1; the ranks stopped at step 5: A process"
    )


def killed_launcher_run(tmp_path, *, last_verdict: str, rank_exit: dict):
    """`ddpdoctor run` was SIGKILLed: run.json names its (dead) pid on this host, the last
    diagnosis.json it wrote is not final, and its reaper ended the ranks."""
    from ddpdoctor.monitor.follow.liveness import this_host
    from tests.unit.monitor.test_monitor_ended_runs import dead_pid

    run, clock, w = finished_training(tmp_path)
    pid = dead_pid()
    run.run_json.write_text(json.dumps(
        {"world_size": 2, "backend": "gloo", "hosts": [this_host()], "launcher_pid": pid}
    ))  # fmt: skip
    run.diagnosis_json.write_text(json.dumps({
        "verdict": last_verdict, "culprits": [1] if last_verdict == "hang" else [], "final": False,
        "findings": [{"id": last_verdict, "severity": "error", "summary": "rank 1 hung",
                      "fix": "", "ranks": [1], "evidence": []}] if last_verdict == "hang" else [],
    }))  # fmt: skip
    for rank in (0, 1):
        if rank_exit:
            w.ev(rank, "exit", **rank_exit)
    processes.say_launcher_killed(run.path, 3)  # what its reaper leaves
    return run, clock, pid


@pytest.mark.parametrize(
    "rank_exit",
    [{"code": 0, "reason": "normal"}, {"code": -15, "reason": "signal", "signal": "SIGTERM"}, {}],
    ids=["exit-0", "sigterm", "no-exit-event"],
)
def test_watch_after_ddpdoctor_was_killed_is_interrupted_however_the_ranks_ended(
    tmp_path, rank_exit
):
    """Before: healthy (ranks that swallowed the signal and exited 0) in one case, a crash of
    rank 0 (killed, no exit event) in others."""
    run, clock, pid = killed_launcher_run(tmp_path, last_verdict="running", rank_exit=rank_exit)
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    monitor.state.alive.update({0: False, 1: False})  # the rank pids of the record are gone
    snap = monitor.close()
    assert snap.verdict is Verdict.INTERRUPTED and not snap.culprits, snap.findings
    assert snap.findings[0].id == "run.launcher_killed"
    assert f"ddpdoctor run (pid {pid}) ended before the job did" in snap.findings[0].summary


def test_watch_after_ddpdoctor_was_killed_keeps_the_problem_it_had_found(tmp_path):
    run, clock, _ = killed_launcher_run(
        tmp_path,
        last_verdict="hang",
        rank_exit={"code": -15, "reason": "signal", "signal": "SIGTERM"},
    )
    snap = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close()
    assert snap.verdict is Verdict.HANG and snap.culprits == {1}
    assert [f.id for f in snap.findings][:2] == ["hang", "run.launcher_killed"]


def test_a_watcher_keeps_the_verdict_the_launcher_stopped_the_job_for(tmp_path):
    run, clock, w = finished_training(tmp_path)
    for rank in (0, 1):
        w.ev(rank, "exit", code=-15, reason="signal", signal="SIGTERM")
    run.diagnosis_json.write_text(json.dumps({
        "verdict": "hang", "culprits": [1], "final": True,
        "stopped_for": {"verdict": "hang", "culprits": [1]},
        "findings": [{"id": "hang", "severity": "error", "summary": "rank 1 hung", "fix": "",
                      "ranks": [1], "evidence": []}],
    }))  # fmt: skip
    snap = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close()
    assert snap.verdict is Verdict.HANG and snap.culprits == {1}
    assert snap.findings[0].summary == "rank 1 hung"
    assert any(f.id == "crash.consequence" for f in snap.findings)


def test_a_copy_without_its_diagnosis_is_not_a_killed_launcher(tmp_path):
    """The launcher's pid is gone and there is no final diagnosis.json (deleted from a copy):
    without its reaper's note that proves nothing."""
    run, clock, _ = killed_launcher_run(tmp_path, last_verdict="running", rank_exit={"code": 0})
    (run.path / processes.LAUNCHER_KILLED).unlink()
    run.diagnosis_json.unlink()
    assert Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close().verdict is (
        Verdict.HEALTHY
    )
