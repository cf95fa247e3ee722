"""Canned snapshots with fixed values (times, pids, hosts) and fake sources and jobs for TUI tests.

Nothing here reads a clock: every time in the screen comes from these snapshots, so the SVG
snapshots are byte-for-byte stable.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    LogLine,
    RankState,
    RankView,
    RunInfo,
    Snapshot,
    StackGroup,
    Verdict,
)

T0 = 1_700_000_000.0
HOST = "node-a"
RUN = RunInfo(
    name="20240501-120000",
    run_dir="/runs/20240501-120000",
    world_size=4,
    backend="gloo",
    hosts=(HOST,),
    started_t=T0,
    command=("torchrun", "--nproc-per-node", "4", "-m", "ddpdoctor.reference_job"),
    nnodes=1,
    total_steps=200,
)


def _times(base: float, n: int = 24, wobble: float = 0.01) -> tuple[float, ...]:
    return tuple(round(base + wobble * ((i * 7) % 5 - 2), 4) for i in range(n))


def rank_view(rank: int, **kw) -> RankView:
    defaults = dict(
        rank=rank,
        state=RankState.RUNNING,
        host=HOST,
        pid=41000 + rank,
        local_rank=rank,
        phase="train",
        step=120,
        total_steps=200,
        epoch=1,
        loss=1.2345 - (rank % 8) * 0.01,
        step_time_s=0.21,
        data_time_s=0.02,
        compute_time_s=0.05,
        comm_wait_s=0.14,
        samples_per_s=152.4,
        heartbeat_age_s=0.3,
        alive=True,
        last_event="step 120",
        step_times=_times(0.21),
        group_seqs=(("default", 481),),
        collectives_done=480,
    )
    defaults.update(kw)
    return RankView(**defaults)


HEALTHY_LOGS = (
    LogLine("rank 0 stdout", "epoch 1 step 100 loss 1.2401", rank=0),
    LogLine("rank 1 stdout", "epoch 1 step 100 loss 1.2310", rank=1),
    LogLine(
        "rank 2 stderr",
        "UserWarning: find_unused_parameters=True was specified but no unused parameters",
        rank=2,
        level="warn",
        finding_id="ddp.find_unused_parameters",
    ),
    LogLine("rank 3 stdout", "epoch 1 step 100 loss 1.2290", rank=3),
)


def healthy_snapshot() -> Snapshot:
    ranks = tuple(
        rank_view(
            r,
            step=200,
            state=RankState.DONE,
            exit_code=0,
            heartbeat_age_s=None,
            last_event="exit 0",
            alive=False,
        )
        for r in range(4)
    )
    # A straggler before the end: rank 2 did all of its step's work while the others waited.
    ranks = tuple(
        replace(rv, data_time_s=0.15, compute_time_s=0.05, comm_wait_s=0.01) if rv.rank == 2 else rv
        for rv in ranks
    )
    return Snapshot(
        run=RUN,
        taken_t=T0 + 83.0,
        ranks=ranks,
        verdict=Verdict.HEALTHY,
        logs=HEALTHY_LOGS,
        finished=True,
    )


def hang_snapshot() -> Snapshot:
    waiting = CollectiveView("all_reduce", 482, 41.5, shapes=((2048,),), dtypes=("float32",))
    ranks = []
    for r in range(4):
        if r == 1:
            ranks.append(
                rank_view(
                    r,
                    state=RankState.STALLED,
                    step=120,
                    phase="train",
                    heartbeat_age_s=0.4,
                    last_event="fault hang",
                    comm_wait_s=0.0,
                )
            )
        else:
            ranks.append(
                rank_view(
                    r,
                    state=RankState.WAITING,
                    step=120,
                    collective=waiting,
                    waiting_on=(1,),
                    last_event="collective_start all_reduce #482",
                    group_seqs=(("default", 482),),
                )
            )
    finding = Finding(
        id="hang.culprit",
        severity=Severity.ERROR,
        summary="rank 1 never reached all_reduce #482 of [2048] float32; ranks 0,2-3 wait in it",
        fix="Look at what rank 1 does before that all_reduce (its stack below): a collective "
        "or barrier called on some ranks only, or a rank blocked in data loading or I/O.",
        ranks=(1,),
        evidence=(
            Evidence(
                '{"kind":"fault","fault":"hang","step":121}', file="events/rank-1.jsonl", line=611
            ),
        ),
    )
    stacks = (
        StackGroup(
            ranks=(0, 2, 3),
            frames=(
                "reference_job.py:212 main",
                "reference_job.py:158 train_epoch",
                "… 14 library frames (torch, torch/nn)",
                "distributed_c10d.py:2501 all_reduce",
            ),
            thread="MainThread",
        ),
        StackGroup(
            ranks=(1,),
            frames=(
                "reference_job.py:212 main",
                "reference_job.py:150 train_epoch",
                "faults.py:44 hang_forever",
                "clock_nanosleep (libc.so.6)",
            ),
            thread="MainThread",
        ),
    )
    logs = (
        *HEALTHY_LOGS[:2],
        LogLine("rank 1 stdout", "ddpdoctor: injecting hang on rank 1 at step 121", rank=1),
    )
    return Snapshot(
        run=RUN,
        taken_t=T0 + 95.0,
        ranks=tuple(ranks),
        verdict=Verdict.HANG,
        findings=(finding,),
        stacks=stacks,
        detected_after_s=6.4,
        logs=logs,
        stack_status="captured at 12:01:35 (4 ranks, 2 classes)",
        culprits=frozenset({1}),
    )


def crash_snapshot() -> Snapshot:
    ranks = []
    for r in range(4):
        if r == 3:
            ranks.append(
                rank_view(
                    r,
                    state=RankState.FAILED,
                    step=57,
                    exit_code=1,
                    error="RuntimeError: injected crash on rank 3 at step 58",
                    traceback='Traceback (most recent call last):\n  File "reference_job.py", '
                    "line 150, in train_epoch\nRuntimeError: injected crash on rank 3 at step 58",
                    heartbeat_age_s=None,
                    alive=False,
                )
            )
        else:
            ranks.append(
                rank_view(
                    r,
                    state=RankState.FAILED,
                    step=57,
                    exit_code=1,
                    error="RuntimeError: Connection closed by peer",
                    heartbeat_age_s=None,
                    alive=False,
                )
            )
    findings = (
        Finding(
            id="crash.first",
            severity=Severity.ERROR,
            summary="rank 3 raised RuntimeError: injected crash on rank 3 at step 58 first",
            fix="Fix the exception on rank 3 (traceback in its detail); the other ranks failed "
            "because it left.",
            ranks=(3,),
            evidence=(
                Evidence(
                    "RuntimeError: injected crash on rank 3 at step 58", "logs/3/stderr.log", 41
                ),
            ),
        ),
        Finding(
            id="crash.consequence",
            severity=Severity.INFO,
            summary="ranks 0-2 failed with 'Connection closed by peer' after rank 3 died",
            fix="Nothing to fix on ranks 0-2: these errors follow from rank 3's crash.",
            ranks=(0, 1, 2),
        ),
    )
    logs = (
        LogLine(
            "rank 3 stderr",
            "RuntimeError: injected crash on rank 3 at step 58",
            rank=3,
            level="error",
            finding_id="python.exception",
        ),
        LogLine(
            "rank 0 stderr",
            "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500",
            rank=0,
            level="error",
            finding_id="gloo.peer_closed",
        ),
        LogLine("torchrun", "ChildFailedError: reference_job FAILED", level="error"),
    )
    return Snapshot(
        run=RUN,
        taken_t=T0 + 31.0,
        ranks=tuple(ranks),
        verdict=Verdict.CRASH,
        findings=findings,
        detected_after_s=0.8,
        logs=logs,
        culprits=frozenset({3}),
        finished=True,
    )


def many_ranks_snapshot(world: int = 256, per_host: int = 8) -> Snapshot:
    ranks = tuple(
        rank_view(
            r,
            host=f"node-{r // per_host:03d}",
            local_rank=r % per_host,
            pid=50000 + r,
            step=100 + (r % 3),
        )
        for r in range(world)
    )
    hosts = tuple(dict.fromkeys(rv.host for rv in ranks if rv.host))
    return Snapshot(
        run=replace(RUN, world_size=world, hosts=hosts, nnodes=len(hosts)),
        taken_t=T0 + 60.0,
        ranks=ranks,
        culprits=frozenset({13}),
    )


class FakeSource:
    """Returns its current snapshot on every poll; counts calls; can be told to fail."""

    def __init__(self, snapshot: Snapshot | None = None, *, fail_with: Exception | None = None):
        self.snapshot = snapshot if snapshot is not None else hang_snapshot()
        self.fail_with = fail_with
        self.polls = 0
        self.stack_requests = 0
        self.stack_thread: str | None = None
        self.stopped_for: str | None = None  # as the launcher's SupervisedRun reports it
        self._lock = threading.Lock()

    def poll(self) -> Snapshot:
        with self._lock:
            self.polls += 1
            if self.fail_with is not None:
                raise self.fail_with
            return self.snapshot

    def request_stacks(self) -> None:
        self.stack_requests += 1
        self.stack_thread = threading.current_thread().name


class FakeJob:
    def __init__(self, returncode: int | None = None) -> None:
        self.code = returncode
        self.stops = 0
        self.stop_thread: str | None = None

    def returncode(self) -> int | None:
        return self.code

    def stop(self) -> None:
        self.stops += 1
        self.stop_thread = threading.current_thread().name
        self.code = -15


def pipeline_hang_snapshot() -> Snapshot:
    """A 4-stage GPipe job whose stage 2 stalled in its forward: stages 0 and 1 wait on it."""
    from ddpdoctor.monitor.model.pipeline_view import PipelineView

    def pipe(stage: int, action: str, mb: int) -> PipelineView:
        return PipelineView("ScheduleGPipe", 8, 4, (stage,), 6, action, mb, stage)

    ranks = []
    for r, (action, mb) in enumerate([("F", 3), ("F", 2), ("F", 1), ("F", 0)]):
        if r == 2:
            ranks.append(
                rank_view(
                    r, state=RankState.STALLED, step=5, phase="train", pipeline=pipe(2, "F", 1)
                )
            )
            continue
        peer = r + 1 if r < 2 else 2
        op = "isend" if r < 2 else "irecv"
        call = CollectiveView(
            op, 41, 12.5 - r, group=f"default/p2p/{peer}", shapes=((4, 32),), peers=(peer,)
        )
        ranks.append(
            rank_view(
                r, state=RankState.WAITING, step=5, collective=call, pipeline=pipe(r, action, mb)
            )
        )
    finding = Finding(
        id="hang",
        severity=Severity.ERROR,
        summary="rank 2 (pipeline stage 2/4) stopped answering its neighbours at step 6 F1 "
        "(stage 2): rank 1 waits in isend #41 to rank 2 at train_pp.py:72 main for 11 s",
        fix="Look at what the stage does at the line named.",
        ranks=(2,),
        evidence=(Evidence("rank 2 is stuck at train_pp.py:34 forward", "train_pp.py", 34),),
    )
    return Snapshot(
        run=RUN,
        taken_t=T0 + 95.0,
        ranks=tuple(ranks),
        verdict=Verdict.HANG,
        findings=(finding,),
        detected_after_s=5.4,
        culprits=frozenset({2}),
    )
