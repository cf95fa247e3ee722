"""A rank is who ddpdoctor saw: records no process of the job is behind (a rank outside the
world, a pid that does not exist or is not the run's, events without a hello, a node summary
naming a rank the launch never made) are a warning, never a culprit or a reason to stop; a real
rank of the run that then dies still is one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.follow.vouching import vouch_local
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
from ddpdoctor.protocol.rank_socket import ENV_RANK_SOCKET, RankSocket, say_rank
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, run_env, train

KW = {"capture_stacks": False, "explain_logs": False, "write_diagnosis": False}
NO_SUCH_PID = 4_190_001
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def command_run(tmp_path) -> RunDir:
    """A user's command (`ddpdoctor run -- python train.py`): the world is what its ranks say."""
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(json.dumps({"launch_mode": "command", "backend": "gloo"}))
    return run


def forge(run: RunDir, rank: int, clock: Clock, *, pid=NO_SUCH_PID, world=8, hello=True) -> None:
    """A file no process of the job wrote: a hello, then an error and a non-zero exit."""
    events = []
    if hello:
        events.append(
            {"kind": "hello", "local_rank": 0, "world_size": world, "host": this_host(), "pid": pid}
        )
    events += [
        {"kind": "error", "type": "RuntimeError", "message": "boom"},
        {"kind": "exit", "code": 1, "reason": "exception"},
    ]
    with open(run.events_file(rank), "a") as fh:
        for event in events:
            fh.write(json.dumps({"v": 1, "t": clock.t, "mono": 0.0, "rank": rank, **event}) + "\n")


def healthy_pair(run: RunDir, clock: Clock) -> Writer:
    """Ranks 0 and 1 of this host, stood in for by this test process (it holds their files)."""
    w = Writer(run, clock, host=this_host())
    w.start(pids=[os.getpid(), os.getpid()])
    train(w, clock, 3)
    return w


def unvouched(snap):
    return [f for f in snap.findings if f.id == "run.unvouched"]


def test_a_forged_rank_with_a_pid_that_does_not_exist_is_a_warning_not_a_crash(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    _w = healthy_pair(run, clock)  # (holds the ranks' files while the test runs)
    monitor = Monitor(run, clock=clock, **KW)
    forge(run, 7, clock)  # "rank 7 of 8", pid nowhere
    snap = monitor.poll()
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert [v.rank for v in snap.ranks] == [0, 1]  # its world of 8 is not believed either
    (finding,) = unvouched(snap)
    assert finding.severity.value == "warning"
    assert f"rank 7 on {this_host()}: pid {NO_SUCH_PID} is no process" in finding.summary
    clock.t += 30.0
    assert monitor.poll().verdict is Verdict.RUNNING  # later polls keep it out


def test_a_forged_rank_naming_a_live_process_of_someone_else_is_refused(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    _w = healthy_pair(run, clock)  # (holds the ranks' files while the test runs)
    monitor = Monitor(run, clock=clock, **KW)
    with subprocess.Popen(SLEEPER) as other:  # alive, but not started by the run
        try:
            forge(run, 2, clock, pid=other.pid, world=3)
            snap = monitor.poll()
        finally:
            other.kill()
    assert snap.verdict is Verdict.RUNNING and len(snap.ranks) == 2
    assert "is not a process of this run" in unvouched(snap)[0].summary


def test_events_without_a_hello_are_refused(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    _w = healthy_pair(run, clock)  # (holds the ranks' files while the test runs)
    monitor = Monitor(run, clock=clock, **KW)
    forge(run, 5, clock, hello=False)
    snap = monitor.poll()
    assert 5 not in {v.rank for v in snap.ranks}
    assert "rank 5: its events have no hello" in unvouched(snap)[0].summary


def test_outside_the_launched_world_a_hello_does_not_enlarge_it(tmp_path):
    """ddpdoctor's own launch of 2 ranks: rank 7's hello claiming a world of 8 is skipped."""
    run, clock = RunDir.create(tmp_path / "run"), Clock(time.time())
    run.run_json.write_text(json.dumps({"world_size": 2, "backend": "gloo"}))
    _w = healthy_pair(run, clock)  # (holds the ranks' files while the test runs)
    forge(run, 7, clock, pid=os.getpid())
    snap = Monitor(run, clock=clock, **KW).poll()
    assert snap.verdict is Verdict.RUNNING and len(snap.ranks) == 2
    assert any(f.id == "run.bad_events" and "rank 7" in f.summary for f in snap.findings)


def test_a_real_rank_of_the_run_that_dies_is_still_the_culprit(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    with subprocess.Popen(SLEEPER, env=run_env(run)) as rank1:
        try:
            w = Writer(run, clock, host=this_host())
            w.start(pids=[os.getpid(), rank1.pid])
            monitor = Monitor(run, clock=clock, **KW)
            snap = monitor.poll()
            assert not unvouched(snap) and monitor.vouching.vouched == {
                0: os.getpid(),
                1: rank1.pid,
            }
            rank1.send_signal(signal.SIGKILL)
            rank1.wait()
            snap = monitor.poll()
        finally:
            rank1.kill()
    assert snap.ranks[1].state is RankState.GONE
    assert snap.verdict is Verdict.CRASH and snap.culprits == {1}


def test_a_rank_that_ended_cleanly_before_the_first_look_is_kept(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    w = Writer(run, clock, host=this_host())
    w.start(pids=[os.getpid(), NO_SUCH_PID])
    w.ev(1, "exit", code=0, reason="normal")
    snap = Monitor(run, clock=clock, **KW).poll()
    assert snap.ranks[1].state is RankState.DONE and not unvouched(snap)


def test_vouch_local_names_why(tmp_path):
    f = tmp_path / "rank-0.jsonl"
    f.write_text("")
    assert vouch_local(None, None, f, tmp_path) == "its hello names no process"
    assert "is no process" in (vouch_local(NO_SUCH_PID, None, f, tmp_path) or "")
    # a hello from before this process started (an hour before it: a session of every tier
    # runs for over an hour, and a hello an hour before now was after its workers started)
    old = psutil.Process().create_time() - 3600
    assert "started after" in (vouch_local(os.getpid(), old, f, tmp_path) or "")
    assert "not a process of this run" in (vouch_local(os.getpid(), None, f, tmp_path) or "")
    with open(f, "a"):  # holding the rank's file: the process that writes it
        assert vouch_local(os.getpid(), None, f, tmp_path) is None


def _forged_summary(run: RunDir, node: int, clock: Clock) -> None:
    """nodes/node-<N>/summary.json naming "rank 7 of 2", failed."""
    hello = {"v": 1, "t": clock.t, "mono": 0.0, "rank": 7, "kind": "hello", "world_size": 8,
             "host": "nodeB", "pid": 5007, "local_rank": 0}  # fmt: skip
    error = {"v": 1, "t": clock.t, "mono": 0.0, "rank": 7, "kind": "error",
             "type": "RuntimeError", "message": "boom"}  # fmt: skip
    exit_ = {"v": 1, "t": clock.t, "mono": 0.0, "rank": 7, "kind": "exit", "code": 1}
    events = [[1, hello], [2, error], [3, exit_]]
    head = {"schema_version": 3, "node_rank": node, "host": "nodeB", "pid": 11, "seq": 1,
            "t": clock.t, "ranks": [{"rank": 7, "last": 3, "after": 0, "events": events}]}  # fmt: skip
    path = run.nodes_dir / f"node-{node}" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(head) + "\n" + json.dumps({"ranks": [{"rank": 7, "events": events}]})
    )


def test_a_node_summary_naming_a_rank_outside_the_world_stops_nothing(tmp_path):
    run, clock = RunDir.create(tmp_path / "run"), Clock(time.time())
    run.run_json.write_text(json.dumps({"world_size": 2, "nnodes": 2, "backend": "gloo"}))
    for node, host in ((0, this_host()), (1, "nodeB")):
        write_node_record(run, NodeRecord(node, host, 10 + node, torchrun_pid=4_190_100 + node))
    w = Writer(run, clock, host=this_host())
    w.ev(0, "hello", local_rank=0, world_size=2, host=this_host(), pid=os.getpid())
    w.hold(0)
    w.ev(1, "hello", local_rank=0, world_size=2, host="nodeB", pid=5001, ppid=4_190_101)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    lead.poll()
    _forged_summary(run, 1, clock)
    for _ in range(3):
        clock.t += 1.0
        snap = lead.poll()
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert [v.rank for v in snap.ranks] == [0, 1]
    assert any(f.id == "run.bad_events" and "rank 7" in f.summary for f in snap.findings)


def test_a_rank_of_another_host_counts_once_its_nodes_launcher_lists_it(tmp_path):
    """Node 0 of two: rank 1 (nodeB, a child of node 1's torchrun) is vouched for by node 1's
    summary; "rank 3" naming nodeB but no node's torchrun as its parent is no rank of the job."""
    run, clock = RunDir.create(tmp_path / "run"), Clock(time.time())
    run.run_json.write_text(json.dumps({"world_size": 4, "nnodes": 2, "backend": "gloo"}))
    torchrun = {0: 4_190_100, 1: 4_190_101}
    write_node_record(run, NodeRecord(0, this_host(), os.getpid(), torchrun_pid=torchrun[0]))
    write_node_record(run, NodeRecord(1, "nodeB", 11, torchrun_pid=torchrun[1]))
    w = Writer(run, clock, host=this_host())
    w.ev(
        0, "hello", local_rank=0, world_size=4, host=this_host(), pid=os.getpid(), ppid=torchrun[0]
    )
    w.hold(0)
    w.ev(1, "hello", local_rank=0, world_size=4, host="nodeB", pid=5001, ppid=torchrun[1])
    for rank in (0, 1):
        w.ev(rank, "phase", phase="train")
    follower = Monitor(run, node_rank=1, clock=clock, **KW)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    follower.poll()
    lead.poll()
    assert lead.vouching.vouched.get(1) == 5001
    w.ev(3, "hello", local_rank=1, world_size=4, host="nodeB", pid=5003, ppid=77)
    w.ev(3, "error", type="RuntimeError", message="boom")
    w.ev(3, "exit", code=1)
    clock.t += 1.0
    follower.poll()
    snap = lead.poll()
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert "is no node's torchrun" in unvouched(snap)[0].summary


# -- a rank whose process ended before the first look: the kernel's word (rank_socket.py) --------

SAY_AND_DIE = (
    "import os, signal, sys; from ddpdoctor.protocol.rank_socket import say_rank; "
    "say_rank(int(sys.argv[1])); os.kill(os.getpid(), signal.SIGKILL)"
)


def _killed_after_saying(run: RunDir, sock: RankSocket | None, rank: int) -> int:
    """A process of the run that says `rank` to the socket and is SIGKILLed at once: the pid of
    a process gone before the monitor ever looks."""
    env = run_env(run)
    if sock is not None:
        env[ENV_RANK_SOCKET] = str(sock.path)
    child = subprocess.Popen([sys.executable, "-c", SAY_AND_DIE, str(rank)], env=env)
    assert child.wait(timeout=60) == -signal.SIGKILL
    return child.pid


def _first_look(run: RunDir, clock: Clock, dead_pid: int, sock: RankSocket | None):
    w = Writer(run, clock, host=this_host())
    w.start(pids=[os.getpid(), dead_pid])  # rank 1's hello names the process that died
    train(w, clock, 2)
    monitor = Monitor(run, clock=clock, rank_socket=sock, **KW)
    monitor.poll()  # (a rank first seen dead reads as unknown until the next poll)
    clock.t += 0.5
    return w, monitor.poll()


def test_a_rank_killed_before_the_first_look_is_vouched_for_by_the_pid_the_kernel_named(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    sock = RankSocket.open()
    assert sock is not None
    try:
        _w, snap = _first_look(run, clock, _killed_after_saying(run, sock, 1), sock)
    finally:
        sock.close()
    assert not unvouched(snap)
    assert snap.ranks[1].state is RankState.GONE
    assert snap.verdict is Verdict.CRASH and snap.culprits == {1}


def test_without_the_kernels_word_a_rank_gone_before_the_first_look_is_refused(tmp_path):
    """The same rank, unheard (a watcher that did not launch the job has no socket): refused, as
    any file naming a pid that is no process (the known cost: a missed fault, never a forged
    one acted on)."""
    run, clock = command_run(tmp_path), Clock(time.time())
    _w, snap = _first_look(run, clock, _killed_after_saying(run, None, 1), None)
    assert "is no process" in unvouched(snap)[0].summary
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert snap.ranks[1].state is not RankState.GONE, snap.ranks[1]


def test_a_pid_that_said_another_rank_vouches_for_none_but_its_own(tmp_path):
    run, clock = command_run(tmp_path), Clock(time.time())
    sock = RankSocket.open()
    assert sock is not None
    try:
        dead = _killed_after_saying(run, sock, 0)  # it said rank 0; a file says it was rank 1
        assert say_rank(1, str(sock.path))  # this live process says rank 1: for itself alone
        _w, snap = _first_look(run, clock, dead, sock)
    finally:
        sock.close()
    assert "is no process" in unvouched(snap)[0].summary
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert snap.ranks[1].state is not RankState.GONE, snap.ranks[1]


def test_a_hello_naming_a_restarted_ranks_old_pid_is_nobodys(tmp_path):
    """Rank 1's first process said its rank and died; its restart (this process) said rank 1
    too. A hello appended later that names the first pid, with an error and an exit, is a
    forgery of a spent word: refused, no crash."""
    run, clock = command_run(tmp_path), Clock(time.time())
    sock = RankSocket.open()
    assert sock is not None
    try:
        dead = _killed_after_saying(run, sock, 1)
        assert say_rank(1, str(sock.path))  # the restarted rank 1
        w = Writer(run, clock, host=this_host())
        w.start(pids=[os.getpid(), dead])
        train(w, clock, 2)
        w.ev(1, "hello", local_rank=1, world_size=2, host=this_host(), pid=os.getpid())
        forge(run, 1, clock, pid=dead, world=2)  # the old pid again, failing
        monitor = Monitor(run, clock=clock, rank_socket=sock, **KW)
        monitor.poll()
        clock.t += 0.5
        snap = monitor.poll()
    finally:
        sock.close()
    assert "is no process" in unvouched(snap)[0].summary
    assert snap.verdict is not Verdict.CRASH and not snap.culprits
