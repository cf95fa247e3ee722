"""The stop never rewrites the verdict: a job the launcher stopped for a confirmed problem keeps
that verdict and its culprits, whatever the ranks do as they are stopped (canned events)."""

from __future__ import annotations

from ddpdoctor.launch.supervise import StopPolicy, SupervisedRun
from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.model.snapshot import Verdict
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, hang, new_run, train, wait


class Job:
    """The launcher's job as SupervisedRun drives it: running until stopped."""

    def __init__(self) -> None:
        self.stopped = 0
        self.code: int | None = None

    def returncode(self) -> int | None:
        return self.code

    def refresh(self) -> None:
        pass

    def track(self, _pids) -> None:
        pass

    def stop(self) -> None:
        self.stopped += 1


def stopped_hang(tmp_path, *, started: bool = True):
    """Rank 1 hangs before all_reduce #seq while rank 0 waits in it; the launcher stops the job.
    `started`: rank 0's all_reduce has a collective_start event (else only its heartbeats name
    it, as for DDP's own gradient all-reduce)."""
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    job = Job()
    supervised = SupervisedRun(monitor, job, StopPolicy(keep_running=False, clock=clock))
    w.start()
    seq = train(w, clock, 8) + 1
    if started:
        fault_t = hang(w, clock, seq, 3.0)
    else:
        w.ev(1, "fault", inject="hang:rank=1,step=9", fault="hang", step=9)
        fault_t = clock.t
        wait(w, clock, seq, fault_t, 3.0)
    for _ in range(30):
        wait(w, clock, seq, fault_t, 1.0)
        snap = supervised.poll()
        if job.stopped:
            break
    assert job.stopped == 1 and snap.verdict is Verdict.HANG and snap.culprits == {1}
    return run, clock, w, monitor, job, seq


def test_the_stop_keeps_a_hang_when_the_waiting_rank_dies_first(tmp_path):
    """The race seen on two nodes: rank 0, waiting in DDP's all-reduce, gets "Connection closed
    by peer" once rank 1 is stopped; its runtime closes its step at exit and it exits 1 before
    rank 1's SIGTERM exit is recorded. Diagnosed anew that reads as a crash of rank 0 or 1."""
    _run, clock, w, monitor, job, seq = stopped_hang(tmp_path, started=False)
    clock.t += 0.2
    error = "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:41234"
    w.ev(0, "step", step=seq, step_time_s=9.0, data_time_s=0.0, compute_time_s=0.0,
         comm_wait_s=9.0)  # fmt: skip
    w.ev(0, "heartbeat", step=seq, open=None)  # its heartbeat thread runs until the exit
    w.ev(0, "error", exc_type="RuntimeError", message=error, traceback=error, fatal=True)
    w.ev(0, "exit", code=1, reason="exception")
    clock.t += 0.5
    w.ev(1, "exit", code=-15, reason="signal", signal="SIGTERM")
    job.code = 1
    final = monitor.close(job_ended=True)
    assert final.verdict is Verdict.HANG and final.culprits == {1}
    assert final.findings[0].id == "hang"
    stop = next(f for f in final.findings if f.id == "crash.consequence")
    assert stop.ranks == (0, 1) and "ddpdoctor stopped the job" in stop.summary
    assert not [f for f in final.findings if f.id == "crash"]


def test_the_stop_keeps_a_hang_when_a_signal_handler_runs_one_more_collective(tmp_path):
    """Lightning's SIGTERM handler runs a collective while the job is stopped: rank 1 starts a
    barrier that rank 0 never matches. Diagnosed anew that is a mismatch; it is the stop."""
    run, clock, w, monitor, job, seq = stopped_hang(tmp_path)
    clock.t += 0.2
    w.ev(1, "collective_start", op="barrier", seq=seq, group="default", shapes=[], dtypes=[])
    w.ev(0, "exit", code=-15, reason="signal", signal="SIGTERM")
    clock.t += 0.5
    w.ev(1, "exit", code=-15, reason="signal", signal="SIGTERM")
    job.code = 1
    final = monitor.close(job_ended=True)
    assert final.verdict is Verdict.HANG and final.culprits == {1}
    assert run.diagnosis_json.exists()


def test_a_user_stop_after_a_confirmed_hang_keeps_the_hang(tmp_path):
    """Ctrl-C once the hang was found (--keep-running): the ranks die of the SIGTERM that follows,
    which read anew is a run stopped from outside; the hang found before stays."""
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    w.start()
    seq = train(w, clock, 8) + 1
    fault_t = hang(w, clock, seq, 3.0)
    for _ in range(30):
        wait(w, clock, seq, fault_t, 1.0)
        if monitor.poll().confirmed:
            break
    for rank in (0, 1):
        w.ev(rank, "exit", code=-15, reason="signal", signal="SIGTERM")
    final = monitor.close(job_ended=True, interrupted=True, verdict_before=Verdict.HANG)
    assert final.verdict is Verdict.HANG and final.culprits == {1}


def test_a_copied_record_of_a_stopped_hang_still_reads_as_the_hang(tmp_path):
    """Every rank ended by ddpdoctor's SIGTERM, diagnosis.json gone (a run directory mailed in):
    the hang in the record stands; "stopped from outside" is only ever said of a crash."""
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    seq = train(w, clock, 8) + 1
    fault_t = hang(w, clock, seq, 3.0)
    wait(w, clock, seq, fault_t, 6.0)
    for rank in (0, 1):
        w.ev(rank, "exit", code=-15, reason="signal", signal="SIGTERM")
    clock.t += 100.0
    final = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False).close()
    assert final.verdict is Verdict.HANG and final.culprits == {1}
