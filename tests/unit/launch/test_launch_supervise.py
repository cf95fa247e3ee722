"""The launcher's policy on bad verdicts, on constructed snapshots with a fake clock."""

from __future__ import annotations

from ddpdoctor.launch.supervise import (
    STACK_WAIT_S,
    Decision,
    StopPolicy,
    SupervisedRun,
    local_rank_pids,
    stacks_settled,
)
from ddpdoctor.monitor.model.snapshot import (
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    StackGroup,
    Verdict,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snap(
    verdict=Verdict.RUNNING, *, stacks=(), stack_status=None, ranks=(), confirmed=None
) -> Snapshot:
    return Snapshot(
        confirmed=verdict.is_problem if confirmed is None else confirmed,
        run=RunInfo(name="r", run_dir="/tmp/r"),
        taken_t=0.0,
        ranks=tuple(ranks),
        verdict=verdict,
        stacks=tuple(stacks),
        stack_status=stack_status,
    )


GROUP = StackGroup(ranks=(1,), frames=("train.py:10 main",))


def test_healthy_and_running_jobs_are_left_alone():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    for verdict in (Verdict.RUNNING, Verdict.HEALTHY):
        clock.now += 100
        decision = policy.observe(snap(verdict), job_running=True)
        assert decision.stop is None and not decision.capture_stacks


def test_an_unconfirmed_hang_is_never_stopped():
    """A hang with no culprit confirmed blocked (all ranks in one collective: the transport) is
    reported, not stopped: ddpdoctor stops a job only on a certain verdict."""
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    for _ in range(5):
        clock.now += STACK_WAIT_S
        hang = snap(Verdict.HANG, stacks=[GROUP], confirmed=False)
        assert policy.observe(hang, job_running=True) == Decision()
    assert policy.stopped_for is None


def test_hang_stops_once_the_stacks_are_in():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    assert policy.observe(snap(Verdict.HANG), job_running=True).stop is None
    clock.now += 1
    capturing = snap(Verdict.HANG, stack_status="capturing stacks of 2 ranks…")
    assert policy.observe(capturing, job_running=True).stop is None
    clock.now += 1
    done = snap(Verdict.HANG, stacks=[GROUP], stack_status="captured 2 ranks at 12:00:00")
    assert policy.observe(done, job_running=True).stop is Verdict.HANG
    assert policy.stopped_for is Verdict.HANG
    # Once only.
    assert policy.observe(done, job_running=True).stop is None


def test_hang_stops_at_the_latest_after_the_stack_wait():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    capturing = snap(Verdict.HANG, stack_status="capturing stacks of 2 ranks…")
    assert policy.observe(capturing, job_running=True).stop is None
    clock.now += STACK_WAIT_S - 0.1
    assert policy.observe(capturing, job_running=True).stop is None
    clock.now += 0.2
    assert policy.observe(capturing, job_running=True).stop is Verdict.HANG


def test_failed_capture_counts_as_settled():
    assert stacks_settled(snap(stack_status="stack capture failed: OSError: x"))
    assert stacks_settled(snap(stack_status="py-spy is not installed"))
    assert stacks_settled(snap(stacks=[GROUP]))
    assert not stacks_settled(snap(stack_status="capturing stacks of 2 ranks…"))
    assert not stacks_settled(snap())


def test_keep_running_never_stops():
    clock = Clock()
    policy = StopPolicy(keep_running=True, clock=clock)
    for _ in range(5):
        clock.now += 100
        done = snap(Verdict.HANG, stacks=[GROUP])
        assert policy.observe(done, job_running=True).stop is None
    assert policy.stopped_for is None


def test_crash_gives_torchrun_time_to_tear_down():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    crash = snap(Verdict.CRASH, stacks=[GROUP])
    assert policy.observe(crash, job_running=True).stop is None
    clock.now += 10
    assert policy.observe(crash, job_running=True).stop is None
    clock.now += 6
    assert policy.observe(crash, job_running=True).stop is Verdict.CRASH


def test_mismatch_waits_a_moment_then_asks_for_stacks_then_stops():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    mismatch = snap(Verdict.MISMATCH)
    assert policy.observe(mismatch, job_running=True) == Decision()
    clock.now += 2.5
    assert policy.observe(mismatch, job_running=True) == Decision()  # not before 3 s
    clock.now += 1
    decision = policy.observe(mismatch, job_running=True)
    assert decision.capture_stacks and decision.stop is None
    assert not policy.observe(mismatch, job_running=True).capture_stacks  # asked once
    clock.now += 1
    settled = snap(Verdict.MISMATCH, stacks=[GROUP])
    assert policy.observe(settled, job_running=True).stop is Verdict.MISMATCH


def test_a_finished_job_is_never_stopped():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    clock.now += 100
    assert policy.observe(snap(Verdict.HANG, stacks=[GROUP]), job_running=False).stop is None


def test_verdict_going_back_to_running_resets_the_wait():
    clock = Clock()
    policy = StopPolicy(keep_running=False, clock=clock)
    policy.observe(snap(Verdict.CRASH), job_running=True)
    clock.now += 14
    policy.observe(snap(Verdict.RUNNING), job_running=True)
    clock.now += 2
    assert policy.observe(snap(Verdict.CRASH), job_running=True).stop is None


class FakeMonitor:
    def __init__(self, snapshots):
        self.snapshots = list(snapshots)
        self.stack_requests = 0

    def poll(self):
        return self.snapshots.pop(0)

    def request_stacks(self):
        self.stack_requests += 1


class FakeJob:
    def __init__(self):
        self.tracked: list[int] = []
        self.stops = 0
        self.refreshes = 0

    def returncode(self):
        return None

    def refresh(self):
        self.refreshes += 1

    def track(self, pids):
        self.tracked.extend(pids)

    def stop(self):
        self.stops += 1


def test_supervised_run_applies_the_policy_on_each_poll():
    ranks = [
        RankView(rank=0, state=RankState.WAITING, host="here", pid=11, alive=True),
        RankView(rank=1, state=RankState.STALLED, host="elsewhere", pid=22, alive=None),
    ]
    hang = snap(Verdict.HANG, stacks=[GROUP], ranks=ranks)
    monitor, job, stopped = FakeMonitor([snap(), hang]), FakeJob(), []
    run = SupervisedRun(
        monitor, job, StopPolicy(keep_running=False, clock=Clock()), on_stop=stopped.append
    )
    assert run.poll().verdict is Verdict.RUNNING and job.stops == 0
    assert run.poll() is hang
    assert job.stops == 1 and stopped == [Verdict.HANG] and run.stopped_for is Verdict.HANG
    assert job.tracked == [11] and job.refreshes == 2
    run.request_stacks()
    assert monitor.stack_requests == 1


def test_local_rank_pids_are_the_live_ranks_on_this_host():
    ranks = [
        RankView(rank=0, state=RankState.RUNNING, host="a", pid=1, alive=True),
        RankView(rank=1, state=RankState.RUNNING, host="b", pid=2, alive=None),  # other host
        RankView(rank=2, state=RankState.STARTING, host="a", pid=None, alive=None),
        RankView(rank=3, state=RankState.DONE, host="a", pid=4, alive=True),  # exiting
        RankView(rank=4, state=RankState.WAITING, host="a", pid=5, alive=False),
        RankView(rank=5, state=RankState.STALLED, host="a", pid=6, alive=True),
    ]
    assert local_rank_pids(snap(ranks=ranks)) == [1, 6]


class FakeNodesMonitor(FakeMonitor):
    node_rank = 0

    def __init__(self, snapshots, nodes):
        super().__init__(snapshots)
        self.nodes = nodes

    def own_ranks(self, snapshot):
        return {}

    def node_ranks(self, snapshot):
        return {}


def test_a_node_that_never_started_its_part_ends_the_wait_for_the_rendezvous():
    from ddpdoctor.protocol.node_records import NodeRecord

    starting = NodeRecord(node_rank=1, host="b", launcher_pid=7)
    failed = starting.with_(ended_t=1000.0, exit_code=1)  # its doctor failed: no torchrun
    monitor = FakeNodesMonitor([snap(), snap(), snap()], {1: starting})
    job = FakeJob()
    run = SupervisedRun(monitor, job, StopPolicy(keep_running=False, clock=Clock()))
    run.poll()
    assert job.stops == 0 and run.abandoned_by is None  # node 1 is still on its way
    monitor.nodes = {1: failed}
    run.poll()
    run.poll()
    assert job.stops == 1 and run.abandoned_by == 1  # stopped once, for node 1


def test_a_node_that_started_and_ended_is_not_a_node_that_never_started():
    from ddpdoctor.launch.supervise import peer_never_started
    from ddpdoctor.protocol.node_records import NodeRecord

    ran = NodeRecord(node_rank=1, host="b", launcher_pid=7, started_t=990.0, ended_t=1000.0)
    never = NodeRecord(node_rank=2, host="c", launcher_pid=8, ended_t=1000.0)
    assert peer_never_started({1: ran}, 0) is None
    assert peer_never_started({1: ran, 2: never}, 0) is never
    assert peer_never_started({2: never}, 2) is None  # its own record
    assert peer_never_started({2: never}, None) is None  # one node: no records matter
