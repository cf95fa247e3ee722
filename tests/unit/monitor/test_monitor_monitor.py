from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.rundir import ENV_RUN_DIR, RunDir
from ddpdoctor.stacks import capture as stacks_module
from ddpdoctor.stacks.groups import Frame, RankStacks, StackCapture, ThreadStack
from tests.unit.monitor.test_monitor_builders import NOW


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Writer:
    """Appends events to a run directory the way ranks do, one line at a time."""

    def __init__(self, run: RunDir, clock: Clock, host: str = "elsewhere") -> None:
        self.run, self.clock, self.host = run, clock, host
        self.held: list = []  # event files held open, as a rank's writer holds its own

    def hold(self, rank: int) -> None:
        """This test process stands in for the rank: it holds the rank's event file open, as
        the runtime's writer does, so that ddpdoctor can vouch for it as a process of the run."""
        self.held.append(open(self.run.events_file(rank), "a"))  # noqa: SIM115

    def ev(self, rank: int, kind: str, **fields) -> None:
        event = {"v": 1, "t": self.clock.t, "mono": 0.0, "rank": rank, "kind": kind, **fields}
        with open(self.run.events_file(rank), "a") as fh:
            fh.write(json.dumps(event) + "\n")

    def start(self, world: int = 2, pids=None) -> None:
        for r in range(world):
            pid = pids[r] if pids else 5000 + r
            self.ev(r, "hello", local_rank=r, world_size=world, host=self.host, pid=pid)
            if pid == os.getpid():
                self.hold(r)
            self.ev(r, "phase", phase="train")


def run_env(run: RunDir | os.PathLike[str]) -> dict[str, str]:
    """The environment of a process that stands in for a rank: the run started it."""
    return {**os.environ, ENV_RUN_DIR: str(run.path if isinstance(run, RunDir) else run)}


def new_run(tmp_path) -> RunDir:
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(json.dumps({"world_size": 2, "backend": "gloo"}))
    return run


def train(w: Writer, clock: Clock, steps: int, seq0: int = 0) -> int:
    for i in range(steps):
        seq = seq0 + i + 1
        for r in range(2):
            w.ev(
                r,
                "collective_start",
                op="all_reduce",
                seq=seq,
                group="default",
                shapes=[[10]],
                dtypes=["float32"],
            )
            w.ev(
                r,
                "collective_end",
                op="all_reduce",
                seq=seq,
                group="default",
                duration_s=0.01,
                ok=True,
            )
            w.ev(
                r,
                "step",
                step=seq,
                step_time_s=0.1,
                data_time_s=0.01,
                compute_time_s=0.08,
                comm_wait_s=0.01,
            )
        clock.t += 0.1
    return seq0 + steps


def hang(w: Writer, clock: Clock, seq: int, seconds: float) -> float:
    """Rank 1 stops before collective #seq; rank 0 waits in it. Returns the fault time."""
    w.ev(1, "fault", inject="hang:rank=1,step=9", fault="hang", step=9)
    w.ev(
        0,
        "collective_start",
        op="all_reduce",
        seq=seq,
        group="default",
        shapes=[[10]],
        dtypes=["float32"],
    )
    wait(w, clock, seq, clock.t, seconds)
    return clock.t - seconds


def wait(w: Writer, clock: Clock, seq: int, since: float, seconds: float) -> None:
    """`seconds` more of the same hang: heartbeats go on, nothing progresses."""
    end = clock.t + seconds
    while clock.t < end - 1e-9:
        clock.t += 0.5
        w.ev(
            0,
            "heartbeat",
            step=seq - 1,
            open={"op": "all_reduce", "seq": seq, "group": "default", "since_t": since},
        )
        w.ev(1, "heartbeat", step=seq - 1, open=None)


def test_live_hang_is_found_at_the_threshold_and_written(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    w.start()
    seq = train(w, clock, 8)
    snap = monitor.poll()
    assert snap.verdict is Verdict.RUNNING and not run.diagnosis_json.exists()
    fault_t = hang(w, clock, seq + 1, 3.0)
    snap = monitor.poll()
    assert snap.verdict is Verdict.RUNNING and snap.ranks[0].state is RankState.WAITING
    assert snap.ranks[0].waiting_on == (1,)
    wait(w, clock, seq + 1, fault_t, 3.0)
    snap = monitor.poll()
    assert snap.verdict is Verdict.HANG and snap.culprits == {1}
    assert snap.detected_after_s == pytest.approx(clock.t - fault_t)
    written = json.loads(run.diagnosis_json.read_text())
    assert written["verdict"] == "hang" and written["culprits"] == [1]
    assert written["findings"][0]["id"] == "hang"


def test_torn_event_line_is_read_once_complete(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    line = json.dumps(
        {
            "v": 1,
            "t": clock.t,
            "rank": 0,
            "kind": "hello",
            "host": "x",
            "pid": 1,
            "local_rank": 0,
            "world_size": 2,
        }
    )
    with open(run.events_file(0), "w") as fh:
        fh.write(line[:20])
    assert monitor.poll().ranks[0].state is RankState.STARTING
    with open(run.events_file(0), "a") as fh:
        fh.write(line[20:] + "\n")
    assert monitor.poll().ranks[0].host == "x"


def test_a_local_process_that_vanishes_is_gone_and_the_run_crashed(tmp_path):
    run, clock = new_run(tmp_path), Clock(time.time())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=run_env(run))
    try:
        w = Writer(run, clock, host=this_host())
        w.start(pids=[proc.pid, 999_999])  # rank 1's pid exists nowhere
        w.ev(1, "exit", code=0, reason="normal")
        monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
        snap = monitor.poll()
        assert snap.ranks[0].alive is True and snap.ranks[0].state is RankState.RUNNING
        assert snap.ranks[1].state is RankState.DONE  # its exit event counts, not its pid
        proc.kill()
        proc.wait()
        snap = monitor.poll()
        assert snap.ranks[0].state is RankState.GONE and snap.ranks[0].alive is False
        assert snap.verdict is Verdict.CRASH and snap.findings[0].id == "died"
    finally:
        proc.kill()


def fake_capture(targets):
    def thread(name, *frames):
        return ThreadStack(
            1, name, tuple(Frame(f, file, line) for file, line, f in frames), is_main=True
        )

    ranks = []
    for rank, pid in targets.items():
        if rank == 1:
            t = thread(
                "MainThread", ("/job/train.py", 50, "main"), ("/job/train.py", 120, "_inject_hang")
            )
        else:
            t = thread("MainThread", ("/job/train.py", 50, "main"), ("/job/train.py", 77, "step"))
        ranks.append(RankStacks(rank, pid, (t,)))
    return StackCapture("c1", None, time.time(), tuple(ranks))


def test_a_hang_captures_stacks_once_in_the_background(tmp_path, monkeypatch):
    calls = []

    def capture(run_dir, targets, *, timeout_s, **kw):
        calls.append(dict(targets))
        return fake_capture(targets)

    monkeypatch.setattr(stacks_module, "capture_stacks", capture)
    run, clock = new_run(tmp_path), Clock(time.time())
    w = Writer(run, clock, host=this_host())
    monitor = Monitor(run, clock=clock, explain_logs=False)
    import os

    w.start(pids=[os.getpid(), os.getpid()])  # both "alive": this test process
    seq = train(w, clock, 3)
    hang(w, clock, seq + 1, 6.0)
    snap = monitor.poll()
    assert snap.verdict is Verdict.HANG and snap.stack_status.startswith("capturing")
    monitor.stacks.wait(5)
    snap = monitor.poll()
    assert calls == [{0: os.getpid(), 1: os.getpid()}]
    assert [g.ranks for g in snap.stacks] == [(0,), (1,)] or [g.ranks for g in snap.stacks] == [
        (1,),
        (0,),
    ]
    assert "stack: train.py:120 _inject_hang" in snap.findings[0].summary
    assert any(e.text.startswith("rank 1 stack:") for e in snap.findings[0].evidence)
    monitor.poll()
    assert len(calls) == 1  # once per hang
    assert monitor.request_stacks()
    monitor.stacks.wait(5)
    assert len(calls) == 2


def test_ptrace_denied_finding_is_shown(tmp_path, monkeypatch):
    from ddpdoctor.findings import Finding, Severity

    denied = Finding(
        "stacks.ptrace_denied", Severity.WARNING, "py-spy may not attach", "grant ptrace"
    )
    monkeypatch.setattr(
        stacks_module,
        "capture_stacks",
        lambda run_dir, targets, **kw: StackCapture("c", None, 0.0, (), findings=(denied,)),
    )
    run, clock = new_run(tmp_path), Clock(time.time())
    w = Writer(run, clock, host=this_host())
    import os

    w.start(pids=[os.getpid(), os.getpid()])
    monitor = Monitor(run, clock=clock, explain_logs=False)
    monitor.poll()
    monitor.request_stacks()
    monitor.stacks.wait(5)
    snap = monitor.poll()
    assert any(f.id == "stacks.ptrace_denied" for f in snap.findings)
    assert snap.stack_status == "py-spy may not attach"


def test_log_explainers_run_on_the_run_directory(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock, host="vm")
    w.start()
    log = run.logs_dir / "vm" / "none_a" / "attempt_0" / "1"
    log.mkdir(parents=True)
    (log / "stderr.log").write_text(
        "[rank1]: RuntimeError: DDP expects same model across all ranks, but Rank 1 has 2247 params, "
        "while rank 0 has inconsistent 0 params.\n"
    )
    monitor = Monitor(run, clock=clock, capture_stacks=False)
    snap = monitor.poll()
    assert any(line.source == "rank 1 stderr" for line in snap.logs)
    final = monitor.close()
    assert any(
        f.ranks and "DDP expects same model" in " ".join(e.text for e in f.evidence)
        for f in final.findings
    )
    assert json.loads(run.diagnosis_json.read_text())["findings"]


def test_hang_after_from_run_json_is_used(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    run.run_json.write_text(json.dumps({"world_size": 2, "hang_after": 2.5}))
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    assert monitor.poll().thresholds.hang_after_s == 2.5
    assert Monitor(run, hang_after=7.0).hang_after == 7.0


def _run_over_two_nodes_with_one_launcher(path):
    from ddpdoctor.protocol.node_records import NodeRecord, NodeRecorder

    run = RunDir.create(path)
    run.run_json.write_text(json.dumps({"world_size": 2, "nnodes": 2, "started_t": NOW - 20}))
    recorder = NodeRecorder(run, NodeRecord(0, "vm", 10))
    recorder.started(100, NOW - 20)
    return run, recorder


def test_a_run_over_nodes_that_never_started_is_over_once_its_launchers_ended(tmp_path):
    run, recorder = _run_over_two_nodes_with_one_launcher(tmp_path / "run")
    clock = Clock()
    waiting = Monitor(run, clock=clock).poll()
    assert waiting.live and waiting.nodes_missing == (1,) and not waiting.never_started
    # `watch` of the run directory later: every launcher has recorded its end
    recorder.ended(1, 1, NOW + 1)
    clock.t = NOW + 5
    over = Monitor(run, clock=clock).poll()
    assert not over.live and over.never_started
    assert [f.id for f in over.findings] == ["run.nodes_missing"]


def test_the_launcher_knows_the_run_never_started_as_soon_as_torchrun_exited(tmp_path):
    run, _ = _run_over_two_nodes_with_one_launcher(tmp_path / "run")
    monitor = Monitor(run, clock=Clock())
    assert monitor.poll().live  # its own record has not ended yet
    monitor.job_ended = True
    assert monitor.close().never_started


def _hung_run_over_two_nodes(tmp_path):
    from ddpdoctor.protocol.node_records import NodeRecord, NodeRecorder

    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    w.start()
    seq = train(w, clock, 8)
    fault_t = hang(w, clock, seq + 1, 3.0)
    wait(w, clock, seq + 1, fault_t, 3.0)
    lead = NodeRecorder(run, NodeRecord(0, "vm", 10))
    lead.started(100, NOW - 20)
    return run, clock, lead


@pytest.mark.parametrize("lead_ended", [True, False])
def test_a_follower_leaves_the_final_diagnosis_of_node_0(tmp_path, lead_ended):
    """Node 0's final diagnosis stands, also in the moment between its writing it and its node
    record saying it ended (a follower ending then wrote over it: a full run caught the stacks
    of node 0's ranks missing from diagnosis.json)."""
    run, clock, lead = _hung_run_over_two_nodes(tmp_path)
    kw = {"clock": clock, "capture_stacks": False, "explain_logs": False}
    assert Monitor(run, node_rank=0, **kw).close(job_ended=True).verdict is Verdict.HANG
    # what node 0's launcher wrote, marked so that a rewrite shows
    written = json.loads(run.diagnosis_json.read_text())
    assert written["final"] is True and written["writer"]["node_rank"] == 0
    run.diagnosis_json.write_text(json.dumps({**written, "marked": "node 0's"}))
    if lead_ended:
        lead.ended(1, -15, NOW)
    follower = Monitor(run, node_rank=1, **kw).close(job_ended=True)
    assert follower.verdict is Verdict.HANG  # its own verdict (and exit code) stays its own
    after = json.loads(run.diagnosis_json.read_text())
    assert after.get("marked") == "node 0's" and after["writer"]["node_rank"] == 0


@pytest.mark.parametrize("lead_ended", [True, False])
def test_a_final_diagnosis_without_a_writer_stands_once_node_0_ended(tmp_path, lead_ended):
    """A diagnosis.json of a ddpdoctor that did not name its writer: node 0's record tells."""
    run, clock, lead = _hung_run_over_two_nodes(tmp_path)
    kw = {"clock": clock, "capture_stacks": False, "explain_logs": False}
    Monitor(run, node_rank=0, **kw).close(job_ended=True)
    written = json.loads(run.diagnosis_json.read_text())
    del written["writer"]
    run.diagnosis_json.write_text(json.dumps({**written, "marked": "node 0's"}))
    if lead_ended:
        lead.ended(1, -15, NOW)
    Monitor(run, node_rank=1, **kw).close(job_ended=True)
    after = json.loads(run.diagnosis_json.read_text())
    # node 0 ended: its final diagnosis stands; still running: the follower's is the latest
    assert (after.get("marked") == "node 0's") is lead_ended
    assert after["verdict"] == "hang" and after["final"] is True
