"""A node's `gone` claim against what its rank's file holds at the job's end (issue 40): the lab's
healthy Ray job across two hosts, replayed. Node 1's fold read all of rank 1's lines, saw its
process end (Ray ends a worker without exit handlers) and named it gone; its summary carries the
rank's state, not every event (no `replica_digest`, no `ray_call`), so node 0's record of the
rank ended at its last heartbeat. When the summaries stopped standing (the relay ended), node 0
read the rank's own file afresh: its final `replica_digest`, written before the process ended,
is later than that heartbeat, and was taken for the rank going on after the claim: a
`node.gone_refuted` warning on a healthy job. A rank that really goes on after the claim
(heartbeats, steps, any event after the claim's time) is still refuted and never ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.gone_claims import CONFIRM_S
from ddpdoctor.monitor.follow.node_fold import NodeFold
from ddpdoctor.monitor.follow.node_summaries import STALE_AFTER_S
from ddpdoctor.monitor.model.snapshot import RankState
from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
from ddpdoctor.protocol.node_summary import write_summary_text
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, train

KW = {"capture_stacks": False, "explain_logs": False, "write_diagnosis": False}
NO_SUCH_PID = 4_190_001  # rank 1's process, ended
RAY = {"actor_class": "RayTrainWorker", "busy": False, "calls": []}
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Job:
    """Rank 0 on nodeA (node 0, the watcher's), rank 1 on nodeB: node 1's fold (this process,
    its relay actor) reads rank 1's file and writes node 1's summary, as the Ray relay does."""

    def __init__(self, tmp_path, pid: int = NO_SUCH_PID) -> None:
        self.run = RunDir.create(tmp_path / "run")
        self.run.run_json.write_text(json.dumps({"world_size": 2, "nnodes": 2, "backend": "gloo"}))
        self.records = {
            0: NodeRecord(0, "nodeA", 10, torchrun_pid=4_190_010),
            1: NodeRecord(1, "nodeB", os.getpid(), torchrun_pid=4_190_011),
        }
        for record in self.records.values():
            write_node_record(self.run, record)
        self.clock = Clock(time.time())
        self.w = Writer(self.run, self.clock)
        for rank, (host, rank_pid) in enumerate((("nodeA", 5000), ("nodeB", pid))):
            self.w.ev(rank, "hello", local_rank=0, world_size=2, host=host, pid=rank_pid, ray=RAY)
            self.w.ev(rank, "ray_call", state="busy", call="train_fn")
        self.seq = train(self.w, self.clock, 4)
        self.fold = NodeFold(str(self.run.path), 1, host="nodeB")
        self.lead = Monitor(self.run, node_rank=0, clock=self.clock, **KW)
        self.refuted: list[str] = []

    def beat(self, *ranks: int) -> None:
        self.clock.t += 0.25
        for rank in ranks:
            self.w.ev(rank, "heartbeat", step=self.seq, seq=int(self.clock.t))

    def the_end_of_rank(self, rank: int) -> None:
        """What a Ray worker writes as its training function returns and its process group is
        destroyed: its code is idle, a last heartbeat, its final replica digest."""
        self.clock.t += 0.25
        self.w.ev(rank, "ray_call", state="idle", call="train_fn", ok=True)
        self.beat(rank)
        self.clock.t += 0.3
        self.w.ev(rank, "replica_digest", model=0, replica="ddp", step=self.seq, final=True,
                  buffers=False, every=8, digests=[1, 2, 3, 4], calls=[])  # fmt: skip

    def publish(self) -> list[int]:
        """Node 1's summary, as its relay writes it once a second; the ranks it names gone."""
        self.clock.t += 0.5
        text = self.fold.summary(now=self.clock.t)
        write_summary_text(self.run, 1, text)
        return json.loads(text.splitlines()[0])["gone"]

    def poll(self):
        snap = self.lead.poll()
        self.refuted += [f.summary for f in snap.findings if f.id == "node.gone_refuted"]
        return snap

    def relay_ends(self):
        """The relay's end: node 1's record says so, its summary no longer stands for rank 1,
        whose file node 0 reads again from its start (a shared run directory: it has it)."""
        self.clock.t += 0.25
        write_node_record(self.run, self.records[1].with_(ended_t=self.clock.t, exit_code=0))
        for _ in range(5):  # (its record is read afresh over the next polls)
            self.clock.t += 0.25
            snap = self.poll()
        assert self.lead.merge.via == {} and self.lead.state.ranks[1].step == self.seq
        return snap


def test_a_final_event_the_summary_did_not_carry_is_not_the_rank_going_on(tmp_path):
    """The lab's sequence: node 1 names rank 1 gone after reading all of its file; node 0's
    record, from the summary, ends at the rank's last heartbeat; the file read afresh at the
    end has the final replica digest after it. No warning, nothing acted on early, and at the
    end the rank is done (its training function had returned), not "running" for good."""
    with subprocess.Popen(SLEEPER) as worker:  # rank 1's process
        try:
            job = Job(tmp_path, worker.pid)
            job.beat(0, 1)
            assert job.publish() == []
            job.poll()
            job.the_end_of_rank(1)
        finally:
            worker.kill()  # Ray ends the worker: no exit event
    assert job.publish() == [1]
    snap = job.poll()
    assert job.lead.merge.via == {1: 1} and job.lead.merge.gone.pending
    assert snap.ranks[1].state is not RankState.GONE
    snap = job.relay_ends()
    assert job.refuted == [], job.refuted
    assert job.lead.merge.gone.pending  # its own file, read again: no sign of life, it stands
    assert snap.ranks[1].state is not RankState.GONE
    final = job.lead.close(job_ended=True)
    assert not [f for f in final.findings if f.id == "node.gone_refuted"]
    assert final.ranks[1].state is RankState.DONE, final.ranks[1]


def test_a_final_line_that_lands_after_the_claim_is_not_the_rank_going_on(tmp_path):
    """The same, with the final line appended only after node 1's summary named the rank gone
    (made before its process ended, as its time says)."""
    with subprocess.Popen(SLEEPER) as worker:
        try:
            job = Job(tmp_path, worker.pid)
            job.beat(0, 1)
            assert job.publish() == []
            job.poll()
            job.clock.t += 0.25
            job.w.ev(1, "ray_call", state="idle", call="train_fn", ok=True)
            job.beat(1)
            made_t = job.clock.t + 0.3
        finally:
            worker.kill()
    assert job.publish() == [1]
    job.poll()
    assert job.lead.merge.gone.pending
    saved, job.clock.t = job.clock.t, made_t
    job.w.ev(1, "replica_digest", model=0, replica="ddp", step=job.seq, final=True,
             buffers=False, every=8, digests=[1, 2, 3, 4], calls=[])  # fmt: skip
    job.clock.t = saved
    assert job.publish() == [1]
    job.poll()
    job.relay_ends()
    assert job.refuted == [], job.refuted


def test_a_rank_that_goes_on_after_a_gone_claim_is_refuted_and_never_ended(tmp_path):
    """Node 1 names rank 1 gone (the pid its hello gave is no process), while the rank goes on
    writing: its next heartbeat and step refute the claim, which is said, never acted on."""
    job = Job(tmp_path)
    job.beat(0, 1)
    assert job.publish() == [1]
    job.poll()
    assert job.lead.merge.gone.pending
    job.seq = train(job.w, job.clock, 1, job.seq)
    job.beat(0, 1)
    assert job.publish() == [1]
    snap = job.poll()
    assert any("rank 1: its events went on" in said for said in job.refuted), job.refuted
    assert not job.lead.merge.gone.pending and snap.ranks[1].state is not RankState.GONE
    for _ in range(int(STALE_AFTER_S)):  # long past the confirmation: never ended on that word
        job.beat(0, 1)
        job.publish()
        snap = job.poll()
    assert snap.ranks[1].state is not RankState.GONE and job.lead.state.alive.get(1) is not False


def test_any_event_after_the_claims_time_refutes_it(tmp_path):
    """A rank that beats seldom (DDPDOCTOR_HEARTBEAT_S) and does not finish a step within the
    confirmation: a collective it starts after the claim is life too."""
    job = Job(tmp_path)
    job.beat(0, 1)
    assert job.publish() == [1]
    job.poll()
    assert job.lead.merge.gone.pending
    job.clock.t += 0.5
    job.w.ev(1, "collective_start", op="all_reduce", seq=job.seq + 1, group="default",
             shapes=[[10]], dtypes=["float32"])  # fmt: skip
    job.publish()
    job.poll()
    assert any("rank 1: its events went on" in said for said in job.refuted), job.refuted


def test_a_ray_rank_seen_through_its_nodes_summary_is_busy_while_its_code_runs(tmp_path):
    """The summary carries the rank's latest `ray_call`: node 0 sees rank 1 in its training
    function (a stall of it is judged as any rank's, not as a worker waiting for a call), and
    a rank whose process ends inside it is gone, a crash; one that ends after it returned is
    done (Ray ends its workers without exit handlers)."""
    for busy in (True, False):
        job = Job(tmp_path / str(busy))
        job.beat(0, 1)
        if not busy:
            job.clock.t += 0.25
            job.w.ev(1, "ray_call", state="idle", call="train_fn", ok=True)
        job.publish()  # (its process, NO_SUCH_PID, is no more: named gone)
        snap = job.poll()
        assert snap.ranks[1].ray_call == ("train_fn" if busy else None)
        for _ in range(int(CONFIRM_S / 0.5) + 2):  # the claim stands: the rank is silent
            job.beat(0)
            job.publish()
            snap = job.poll()
        assert job.lead.state.alive.get(1) is False and job.refuted == []
        assert snap.ranks[1].state is (RankState.GONE if busy else RankState.DONE), busy
