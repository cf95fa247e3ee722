"""How the monitor ends a run (issue 15): a finished run read whole before its first verdict, the
launcher's diagnosis.json never overwritten by a watcher, NOT_STARTED, INTERRUPTED, and files
it cannot read named in a finding."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.follow.tail import MAX_READ_BYTES
from ddpdoctor.monitor.model.snapshot import Verdict
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, hang, new_run, train


def quiet(run, clock, **kw) -> Monitor:
    return Monitor(run, clock=clock, capture_stacks=False, explain_logs=False, **kw)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_the_first_look_at_a_finished_run_reads_all_of_it(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    seq = train(w, clock, 8500)
    hang(w, clock, seq + 1, 60.0)
    assert run.events_file(0).stat().st_size > MAX_READ_BYTES  # the probe: over 4 MB
    clock.t += 120.0  # watched later: nothing of the run is alive
    first = quiet(run, clock).poll()
    assert first.ranks[0].step == seq and first.ranks[1].step == seq
    assert first.verdict is Verdict.HANG and first.culprits == {1}


def test_a_watcher_never_writes_over_the_launchers_final_diagnosis(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    seq = train(w, clock, 10)
    hang(w, clock, seq + 1, 60.0)
    launcher = quiet(run, clock)
    launcher.poll()
    final = launcher.close(job_ended=True)
    written = json.loads(run.diagnosis_json.read_text())
    assert final.verdict is Verdict.HANG and written["final"] is True
    before = run.diagnosis_json.read_bytes()
    clock.t += 300.0
    watcher = quiet(run, clock, hang_after=1000.0)  # a watch that would see no hang
    assert watcher.poll().verdict is not Verdict.HANG
    watcher.close()
    assert run.diagnosis_json.read_bytes() == before


def run_that_never_started(tmp_path, *, launcher_pid: int):
    run = new_run(tmp_path)
    run.run_json.write_text(
        json.dumps(
            {
                "world_size": 2,
                "backend": "gloo",
                "hosts": [this_host()],
                "launcher_pid": launcher_pid,
            }
        )
    )
    return run


def test_a_run_whose_doctor_failed_is_not_started_and_finished(tmp_path):
    run = run_that_never_started(tmp_path, launcher_pid=dead_pid())
    results = [
        {"id": "network.master_port", "group": "network", "title": "Master port",
         "status": "fail", "summary": "port 29500 is already in use by pid 7",
         "details": ["held by python train.py"], "fix": "kill 7, or pick another port"},
        {"id": "smoke.collectives", "group": "smoke", "title": "Collectives",
         "status": "error", "summary": "timed out after 60 s", "details": [], "fix": None},
        # the script checkup never refused a launch: not a reason
        {"id": "script.collective_under_rank_guard", "group": "script", "title": "t.py:3",
         "status": "fail", "summary": "barrier() under a rank guard", "fix": "call it on all"},
    ]  # fmt: skip
    run.doctor_json.write_text(json.dumps({"counts": {"fail": 2, "error": 1}, "results": results}))
    snap = quiet(run, Clock()).poll()
    assert snap.verdict is Verdict.NOT_STARTED and snap.finished and snap.verdict.is_problem
    port, smoke = snap.findings[:2]
    assert port.id == "preflight.network.master_port" and port.fix == "kill 7, or pick another port"
    assert port.summary == (
        "the preflight refused the launch: Master port: port 29500 is already in use by pid 7"
    )
    assert [e.text for e in port.evidence] == [
        "network.master_port: fail",
        "held by python train.py",
    ]
    assert all(e.file == "doctor.json" for e in port.evidence)
    assert smoke.id == "preflight.smoke.collectives" and "could not run" in smoke.summary
    assert not any(f.id.startswith("preflight.script") for f in snap.findings)


def test_a_live_launcher_with_nothing_written_yet_is_still_starting(tmp_path):
    run = run_that_never_started(tmp_path, launcher_pid=os.getpid())
    snap = quiet(run, Clock()).poll()
    assert snap.verdict is Verdict.RUNNING and not snap.finished


def test_an_unreadable_events_folder_is_named_and_ends_as_not_started(tmp_path):
    run = run_that_never_started(tmp_path, launcher_pid=os.getpid())
    shutil.rmtree(run.events_dir)
    run.events_dir.write_text("not a folder")  # listing it fails, as an unreadable one does
    live = quiet(run, Clock()).poll()
    assert live.verdict is Verdict.RUNNING
    assert [f.id for f in live.findings] == ["run.unreadable"]
    assert "cannot read events/: Not a directory" in live.findings[0].summary
    over = run_that_never_started(tmp_path / "b", launcher_pid=dead_pid())
    shutil.rmtree(over.events_dir)
    over.events_dir.write_text("")
    snap = quiet(over, Clock()).poll()
    assert snap.verdict is Verdict.NOT_STARTED and snap.finished
    assert "no rank's record can be read: events/" in snap.findings[0].summary


def test_a_rank_file_that_cannot_be_read_gets_a_finding(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    train(w, clock, 3)
    monitor = quiet(run, clock)
    assert not monitor.poll().findings
    # Reading it now fails (root reads any file, so a folder in its place stands for one it may
    # not read: the open fails the same way, with the reason in the finding).
    run.events_file(1).unlink()
    run.events_file(1).mkdir()
    clock.t += 0.5
    snap = monitor.poll()
    assert [f.id for f in snap.findings] == ["run.unreadable"]
    assert snap.findings[0].summary.startswith("cannot read events/rank-1.jsonl: ")


def crashed_after_ctrl_c(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    train(w, clock, 5)
    clock.t += 1.0
    for rank in (0, 1):  # what torchrun's SIGINT does to the ranks
        w.ev(rank, "error", exc_type="KeyboardInterrupt", message="", traceback="")
        w.ev(rank, "exit", exit_code=1)
    return run, clock


def test_a_run_the_user_stopped_is_interrupted_not_a_crash(tmp_path):
    run, clock = crashed_after_ctrl_c(tmp_path)
    assert quiet(run, clock).close(job_ended=True).verdict is Verdict.CRASH  # without the note
    snap = quiet(run, clock).close(job_ended=True, interrupted=True, verdict_before=Verdict.RUNNING)
    assert snap.verdict is Verdict.INTERRUPTED and not snap.verdict.is_problem
    assert snap.findings[0].id == "run.interrupted" and not snap.culprits
    written = json.loads(run.diagnosis_json.read_text())
    # nothing was found, so nothing is confirmed (the crash the stop caused was, until then)
    assert written["verdict"] == "interrupted" and written["confirmed"] is False
    assert not snap.confirmed


def test_a_problem_found_before_the_interrupt_stays(tmp_path):
    run, clock = crashed_after_ctrl_c(tmp_path)
    snap = quiet(run, clock).close(job_ended=True, interrupted=True, verdict_before=Verdict.HANG)
    assert snap.verdict is Verdict.CRASH


def test_a_launch_that_ended_with_nothing_recorded_is_not_started(tmp_path):
    # The ranks ran but could not write to events/ (or torchrun never started one): an ended
    # run with no record is a problem, never "running (exit code 0)".
    run = new_run(tmp_path)
    snap = quiet(run, Clock()).close(job_ended=True)
    assert snap.verdict is Verdict.NOT_STARTED and snap.verdict.is_problem
    assert "could not write to events/" in snap.findings[0].summary


def test_a_diagnosis_that_cannot_be_written_is_reported(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    Writer(run, clock).start()
    run.diagnosis_json.mkdir()  # nothing can be renamed over a folder
    monitor = quiet(run, clock)
    monitor.close(job_ended=True)
    assert monitor.write_error is not None
    assert monitor.write_error.startswith(f"cannot write {run.diagnosis_json}: ")


def test_ranks_that_raised_before_joining_a_process_group_crashed(tmp_path):
    """GPU code on a machine without a GPU, launched by the user's own torchrun: no rank ever
    recorded itself (they raise before init_process_group), but the logs hold the traceback.
    The headline is that exception at the user's line, never "not started"."""
    from tests.procs import REPO

    recorded = REPO / "tests" / "fixtures" / "logs" / "local" / "torchrun-no-gpu-before-init.log"
    run = new_run(tmp_path)  # a user's command: the world size is not known before the ranks'
    run.run_json.write_text(json.dumps({"world_size": None, "hosts": ["vm"]}))
    host_logs = run.logs_dir / "vm"
    host_logs.mkdir(parents=True)
    shutil.copy(recorded, host_logs / "torchrun.log")
    snap = Monitor(run, clock=Clock(), capture_stacks=False).close(job_ended=True)
    assert snap.verdict is Verdict.CRASH and snap.culprits == {0}
    first = snap.findings[0]
    assert first.id == "crash.before_init"
    assert "RuntimeError: Found no NVIDIA driver on your system" in first.summary
    assert "gpu_published.py:17 in main, before joining a process group" in first.summary
    assert "torch.cuda.is_available()" in first.fix
    assert "run.not_started" not in {f.id for f in snap.findings}


def test_a_traceback_without_a_failed_rank_is_no_crash():
    """A printed traceback alone (torchrun never said a rank failed) proves no crash."""
    from ddpdoctor.findings import Finding, Severity
    from ddpdoctor.monitor.judge.crash_before_init import crash_before_init
    from tests.unit.monitor.test_monitor_builders import snap

    printed = Finding("python.exception", Severity.ERROR, "A process raised ValueError: x", "fix")
    assert crash_before_init(snap([], findings=(printed,))) is None
