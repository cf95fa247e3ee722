"""Claims in files the job can write are checked against what ddpdoctor saw before they stop
anything: one pid is one rank; an exit line its own live process contradicts is dropped; a
node's "gone" needs its launcher and the rank's silence; the watcher's own network look is the
one it took; run.json's numbers allocate nothing (issue 40, items 1 and 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

from ddpdoctor.launch.supervise import peer_stop
from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.gone_claims import CONFIRM_S, GoneClaims
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.follow.runinfo import run_info
from ddpdoctor.monitor.model.network import LinkView, NodeNetwork
from ddpdoctor.monitor.model.rank_tracker import RankTracker
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.monitor.pipeline.network_follow import NetworkFollow
from ddpdoctor.protocol.node_records import NodeRecord
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, train
from tests.unit.monitor.test_vouching import KW, command_run, forge, healthy_pair

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_one_pid_is_one_rank(tmp_path):
    """A hello naming rank 0's own live pid (a process of the run) and a world of 8."""
    run, clock = command_run(tmp_path), Clock(time.time())
    w = Writer(run, clock, host=this_host())
    w.start(pids=[os.getpid(), os.getpid()])
    train(w, clock, 3)
    monitor = Monitor(run, clock=clock, **KW)
    monitor.poll()
    forge(run, 7, clock, pid=os.getpid())  # this process does not hold rank 7's file
    for _ in range(3):  # (a new event file is found by a later listing of events/)
        clock.t += 2.0
        snap = monitor.poll()
    assert snap.verdict is Verdict.RUNNING and not snap.culprits
    assert [v.rank for v in snap.ranks] == [0, 1] and snap.run.world_size == 2
    (finding,) = [f for f in snap.findings if f.id == "run.unvouched"]
    assert (
        f"pid {os.getpid()} is rank " in finding.summary
        and "one process is one rank" in finding.summary
    )


def test_an_exit_line_the_process_goes_on_after_is_dropped_and_said():
    tracker = RankTracker(1)
    for kind, fields in (
        ("hello", {"pid": 42, "host": "h"}),
        ("error", {"exc_type": "RuntimeError", "message": "forged"}),
        ("exit", {"code": 1}),
        ("step", {"step": 9}),
    ):
        tracker.apply({"kind": kind, "t": 1.0, "rank": 1, **fields})
    assert tracker.exit_code is None and tracker.error_t is None and tracker.step == 9
    assert tracker.contradicted is not None and "exit 1 after RuntimeError" in tracker.contradicted
    restarted = RankTracker(1)  # a new process (another pid) after an exit: no contradiction
    restarted.apply({"kind": "hello", "t": 1.0, "rank": 1, "pid": 42})
    restarted.apply({"kind": "exit", "t": 2.0, "rank": 1, "code": 1})
    restarted.apply({"kind": "hello", "t": 3.0, "rank": 1, "pid": 43})
    assert restarted.contradicted is None


def test_an_exit_line_appended_while_the_process_holds_its_file_is_not_an_end(tmp_path):
    """Rank 1 (this test process, which holds its event file open) gets an error and `exit 1`
    appended: its runtime writes its exit last and closes the file, so the line is not its."""
    run, clock = command_run(tmp_path), Clock(time.time())
    w = healthy_pair(run, clock)
    monitor = Monitor(run, clock=clock, **KW)
    monitor.poll()
    w.ev(1, "error", exc_type="RuntimeError", message="forged")
    w.ev(1, "exit", code=1, reason="exception")
    first = monitor.poll()
    assert first.verdict is Verdict.RUNNING and first.ranks[1].state is not RankState.FAILED
    clock.t += 0.5
    second = monitor.poll()
    assert second.verdict is Verdict.RUNNING and not second.culprits
    (finding,) = [f for f in second.findings if f.id == "run.forged_exit"]
    assert "its process runs on, its event file still open" in finding.summary


def _summary(node: int, gone, host="h2", pid=7001):
    return SimpleNamespace(node_rank=node, host=host, pid=pid, gone=tuple(gone))


def _state(host="h2", pid=999_999_1):
    tracker = SimpleNamespace(exit_code=None, host=host, pid=pid, hello_t=None, events_seen=5,
                              last_event_t=1.0, last_heartbeat_t=1.0, step=3)  # fmt: skip
    state = SimpleNamespace(
        nodes={1: NodeRecord(1, "h2", 7001)}, ranks={1: tracker}, alive={}, gone=[]
    )
    state.set_alive = lambda rank, alive: state.alive.__setitem__(rank, alive)
    return state, tracker


def test_a_gone_claim_needs_the_launcher_and_the_ranks_silence():
    remote = lambda host: False  # noqa: E731
    mine = lambda rank: True  # noqa: E731
    # not the launcher's: another pid than its record names
    claims, (state, _) = GoneClaims(), _state()
    claims.claim(1, _summary(1, [1], pid=1234), state, remote, mine)
    assert not claims.pending and "not its launcher's" in claims.refuted[1]
    # the launcher's word, then the rank writes on: refuted, never acted on
    claims, (state, tracker) = GoneClaims(), _state()
    claims.claim(1, _summary(1, [1]), state, remote, mine)
    claims.settle(state, 100.0)
    tracker.events_seen += 1
    tracker.last_event_t += 1.0  # its next heartbeat
    tracker.last_heartbeat_t += 1.0
    claims.settle(state, 100.0 + CONFIRM_S)
    assert state.alive == {} and "its events went on" in claims.refuted[1]
    # the launcher's word and the rank silent for CONFIRM_S: gone
    claims, (state, _) = GoneClaims(), _state()
    claims.claim(1, _summary(1, [1]), state, remote, mine)
    claims.settle(state, 100.0)
    claims.settle(state, 100.0 + CONFIRM_S)
    assert state.alive == {1: False} and not claims.refuted


def test_the_same_events_read_again_neither_refute_nor_reset_a_gone_claim():
    """At a job's end its node's summary stops standing and the rank's record is read afresh
    from its file: the same events (times as precise as the file's, not the row's rounding).
    That is no sign of life: no warning on a healthy job, and the claim stands, acted on once
    the rank was silent for CONFIRM_S (dropped, it left an ended rank "running" for good)."""
    remote = lambda host: False  # noqa: E731
    mine = lambda rank: True  # noqa: E731
    claims, (state, tracker) = GoneClaims(), _state()
    claims.claim(1, _summary(1, [1]), state, remote, mine)
    claims.settle(state, 100.0)
    tracker.events_seen = 0  # restarted, then read again up to the same last event
    tracker.events_seen = 5
    tracker.last_event_t += 0.00004
    claims.settle(state, 100.0 + CONFIRM_S / 2)
    assert claims.pending and state.alive == {} and claims.findings() == []
    claims.settle(state, 100.0 + CONFIRM_S)
    assert not claims.pending and state.alive == {1: False} and claims.findings() == []
    # a step further is life, whatever the times say
    claims, (state, tracker) = GoneClaims(), _state()
    claims.claim(1, _summary(1, [1]), state, remote, mine)
    claims.settle(state, 100.0)
    tracker.step += 1
    claims.settle(state, 100.0 + 1)
    assert "its events went on" in claims.refuted[1] and state.alive == {}


def test_a_gone_claim_on_a_rank_whose_process_runs_here_is_refuted():
    with subprocess.Popen(SLEEPER) as proc:
        try:
            state, _ = _state(host=this_host(), pid=proc.pid)
            state.nodes = {1: NodeRecord(1, "h2", os.getpid())}  # its launcher: this process
            claims = GoneClaims()
            summary = _summary(1, [1], pid=os.getpid())
            claims.claim(1, summary, state, lambda host: True, lambda rank: True)
        finally:
            proc.kill()
    assert not claims.pending and f"its process (pid {proc.pid}) runs" in claims.refuted[1]
    assert "not taken as gone" in claims.findings()[0].summary


def _look(node: int, host: str, peer: str) -> NodeNetwork:
    link = LinkView(rank=0, local="10.0.0.1", local_port=1, peer=peer, peer_port=2,
                    state="ESTABLISHED", send_q=9, recv_q=0, retransmits=3, total_retrans=3,
                    last_ack_ms=9000, segs_in=0, segs_out=0)  # fmt: skip
    return NodeNetwork(node, host, time.time(), 30.0, (("10.0.0.1", "eth0", "down"),),
                       (link,), ())  # fmt: skip


def test_the_own_network_look_is_the_one_taken_never_the_file(tmp_path):
    run = RunDir.create(tmp_path / "run")
    follow = NetworkFollow(run, 0, {}, look=True)
    forged = _look(0, "h1", "10.0.0.2")  # this node's number: written by someone else
    other = _look(1, "h2", "10.0.0.1")  # node 1's look, naming a link to its own address
    fair = _look(1, "h2", "10.0.0.9")
    kept = follow._checked((forged, other))
    assert kept == () and set(follow.forged) == {0, 1}
    assert follow._checked((fair,)) == (fair,)
    taken = replace(forged, stalled_s=12.0)
    follow.watch.latest = taken  # the look this launcher wrote
    assert follow._checked((forged,)) == (taken,) and follow.own(taken)
    assert not follow.own(forged)
    snap = SimpleNamespace(ranks=())
    assert any(f.id == "network.unvouched" for f in follow.findings(snap))


def test_run_json_numbers_allocate_nothing(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(json.dumps({"world_size": 10**12, "nnodes": 10**12}))
    info = run_info(run)
    assert info.nnodes is None and info.world_size == 10**12  # (said, and bounded where used)
    clock = Clock(time.time())
    w = Writer(run, clock)
    w.start(pids=[11, 12])
    train(w, clock, 2)
    for r in (0, 1):
        w.ev(r, "exit", code=0, reason="normal")
    started = time.monotonic()
    snap = Monitor(run, clock=clock, **KW).poll()
    assert time.monotonic() - started < 5.0
    assert snap.run.world_size == 2 and [v.rank for v in snap.ranks] == [0, 1]
    assert any(f.id == "run.world_disputed" for f in snap.findings)


def test_a_peer_stop_needs_its_torchrun_ended():
    with subprocess.Popen(SLEEPER) as proc:
        try:
            record = NodeRecord(1, this_host(), os.getpid(), torchrun_pid=proc.pid,
                                stopped_for="hang")  # fmt: skip
            assert peer_stop({1: record}, 0) is None  # its torchrun runs: a forged record
        finally:
            proc.kill()
            proc.wait()
    assert peer_stop({1: record}, 0) is Verdict.HANG


def test_a_never_started_record_of_a_launcher_that_runs_is_not_followed():
    from ddpdoctor.launch.supervise import peer_never_started

    never = NodeRecord(1, this_host(), os.getpid(), ended_t=time.time())  # this process runs
    assert peer_never_started({1: never}, 0) is None
    gone = NodeRecord(1, this_host(), 4_190_001, ended_t=time.time())
    assert peer_never_started({1: gone}, 0) is gone
