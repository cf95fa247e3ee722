"""straggler: a rank whose own work per step (data wait + compute) stays well above the others'.

DDP step times synchronize: every rank waits for the slowest in the gradient all-reduce, so the
straggler does not show a longer step. It shows as the rank whose own work is largest while the
others' time waiting inside the all-reduce grows by about the same amount. The stages of a
pipeline do different work by design: a pipeline rank is compared only with the ranks of its
own stage (its data-parallel replicas).

On a host with more runnable threads than cores, every rank's own work includes time its main
thread was ready but waited for a CPU, and the scheduler spreads that wait unevenly from one
window to the next. Where the others wait for a CPU about as much as the candidate does (the
contention is the host's, not this rank's), that wait is taken out of its own work before it is
called a straggler; a rank that alone waits for a CPU (another process on its cores) still is,
and when that wait is its whole excess the finding says so ("mostly waiting for a CPU"), with
the fix for it rather than for its data or compute.
"""

from __future__ import annotations

import bisect
import statistics

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import RankView, Snapshot

MIN_STEPS = rank_index.MIN_OWN_WORK_STEPS  # steps averaged before a rank is judged
RATIO = 1.5  # own work this many times the others' median...
MIN_EXCESS_S = 0.05  # ...and at least this much more per step (noise at tiny steps)
COMM_SHARE = 0.5  # the others' comm wait covers at least this share of the excess
SHARED_RUNQ = 0.5  # the others' run-queue share is at least this much of the candidate's
MIN_RUNQ = 0.05  # a run-queue share below this explains nothing
MAX_FINDINGS = 8  # a job with many slow ranks needs the worst few, not a list of hundreds

FIX_DATA = (
    "This rank waits for its data: give its DataLoader more workers (num_workers), pin_memory, "
    "faster or local storage, or move preprocessing off the training loop; check for a slow "
    "disk or network mount on its node."
)
FIX_COMPUTE = (
    "This rank computes slower: check its device (thermal throttling, clocks, another process "
    "on its GPU or CPU cores — nvidia-smi / top), CPU affinity and OMP_NUM_THREADS, and that its "
    "batches are not larger than the others'."
)

FIX_CPU = (
    "Another process takes this rank's CPU cores (its main thread was ready to run but waited "
    "for a CPU, the other ranks' did not): find it on that host (top, ps), move it, or give the "
    "ranks cores of their own (taskset or numactl; fewer threads per rank with "
    "OMP_NUM_THREADS; fewer ranks per host than cores)."
)


def _own(view: RankView) -> float | None:
    if view.avg_steps < MIN_STEPS:
        return None
    if view.avg_data_time_s is None and view.avg_compute_time_s is None:
        return None
    return (view.avg_data_time_s or 0.0) + (view.avg_compute_time_s or 0.0)


def median_without(ordered: list[float], index: int) -> float:
    """The median of `ordered` (sorted) without the element at `index`, in O(1)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < index else ordered[k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def own_work(snap: Snapshot) -> dict[int, float]:
    """Rank -> its own work per step (_own), for the ranks that have one, in the snapshot's order."""
    index = rank_index.of(snap)
    if index.narrow:
        return index.own_work  # (made in the index's one walk, as below; not to be changed)
    own = {}
    for v in snap.ranks:  # (_own, inline: this runs per rank per poll)
        if v.avg_steps >= MIN_STEPS and (
            v.avg_data_time_s is not None or v.avg_compute_time_s is not None
        ):
            own[v.rank] = (v.avg_data_time_s or 0.0) + (v.avg_compute_time_s or 0.0)
    return own


def detect(snap: Snapshot) -> RuleOutcome | None:
    own = own_work(snap)
    if len(own) < 2:
        return None
    ordered = sorted(own.values())
    # Without the largest value the median is the lowest it can be without any one rank: a
    # rank below RATIO times that is no straggler, whatever the others (most ranks of most
    # polls, at 1000s of ranks, skip the rest of the test here).
    cutoff = RATIO * median_without(ordered, len(ordered) - 1)
    if ordered[-1] < cutoff:
        return None  # (no rank at the cutoff: the pass over every rank below is not needed)
    findings = []
    for rank, work in own.items():
        if work < cutoff:
            continue
        median = median_without(ordered, bisect.bisect_left(ordered, work))
        excess = work - median
        if work < RATIO * median or excess < MIN_EXCESS_S:
            continue
        view = snap.rank(rank)
        assert view is not None
        others_views = [snap.rank(r) for r in own if r != rank]
        stage = _stage(view)
        if stage is not None:  # a pipeline stage: only its own stage's ranks do its work
            peers = [v for v in others_views if v is not None and _stage(v) == stage]
            if stage == () or not peers:
                continue
            others_views = list(peers)
            median = statistics.median(own[v.rank] for v in peers)
            excess = work - median
            if work < RATIO * median or excess < MIN_EXCESS_S:
                continue
        comms = [v.avg_comm_wait_s for v in others_views if v and v.avg_comm_wait_s is not None]
        own_comm = view.avg_comm_wait_s
        if comms:
            others_comm = statistics.median(comms)
            if others_comm < COMM_SHARE * excess:
                continue  # the others do not wait for it: not what slows the job
            if own_comm is not None and own_comm > others_comm:
                continue  # it waits more than they do: it is not the one they wait for
        peers = [v for v in others_views if v is not None]
        if _scheduler_made(view, peers, own, work):
            continue
        cpu_wait = _runq_per_step(view, work) if _cpu_taken(view, peers, own, work) else None
        findings.append(_finding(snap, view, median, excess, comms, cpu_wait))
        if len(findings) >= MAX_FINDINGS:
            break
    if not findings:
        return None
    return RuleOutcome(rule="straggler", findings=tuple(findings))


def _stage(view: RankView) -> tuple[int, ...] | None:
    """The pipeline stages a rank runs: None for a rank that sends and receives nothing (every
    rank does the same work), () for one that does but whose stage is not known (DeepSpeed's
    pipeline engine, a hand-written send/recv exchange): it is compared with nobody."""
    if view.pipeline is not None and view.pipeline.stages:
        return view.pipeline.stages
    if view.sends_p2p:
        return ()
    return None


def _runq_per_step(view: RankView, work: float) -> float:
    """Seconds of its own work per step that its main thread spent waiting for a CPU (the
    wait falls in its own work: in a collective the thread sleeps, it does not queue)."""
    share = view.runq_share or 0.0
    step = work + (view.avg_comm_wait_s or 0.0)
    return min(work, share * step)


def _scheduler_made(
    view: RankView, others: list[RankView], own: dict[int, float], work: float
) -> bool:
    """Whether the excess is the host's CPU contention: the others wait for a CPU about as much
    as this rank, and without that wait its own work is no longer a straggler's."""
    share = view.runq_share
    if share is None or share < MIN_RUNQ:
        return False
    shares = [v.runq_share for v in others if v.runq_share is not None]
    if not shares or statistics.median(shares) < SHARED_RUNQ * share:
        return False  # it alone waits for a CPU: something takes its cores
    nets = [own[v.rank] - _runq_per_step(v, own[v.rank]) for v in others if v.rank in own]
    return _ordinary_without_cpu_wait(view, work, nets)


def _cpu_taken(view: RankView, others: list[RankView], own: dict[int, float], work: float) -> bool:
    """Whether its own wait for a CPU, which the others do not share, is its whole excess: its
    cores are taken (another process on them), not its data or compute slow."""
    share = view.runq_share
    if share is None or share < MIN_RUNQ:
        return False
    return _ordinary_without_cpu_wait(view, work, [own[v.rank] for v in others if v.rank in own])


def _ordinary_without_cpu_wait(view: RankView, work: float, others_work: list[float]) -> bool:
    """Whether its own work, less its wait for a CPU, is no straggler's against `others_work`."""
    if not others_work:
        return False
    net = work - _runq_per_step(view, work)
    median = statistics.median(others_work)
    return net < RATIO * median or net - median < MIN_EXCESS_S


def _finding(
    snap: Snapshot,
    view: RankView,
    median: float,
    excess: float,
    comms: list[float],
    cpu_wait: float | None = None,
) -> Finding:
    """`cpu_wait`: its wait for a CPU per step, when that wait is its whole excess."""
    others = [v for v in snap.ranks if v.rank != view.rank and _own(v) is not None]
    med_data = statistics.median([v.avg_data_time_s or 0.0 for v in others]) if others else 0.0
    med_comp = statistics.median([v.avg_compute_time_s or 0.0 for v in others]) if others else 0.0
    data_excess = (view.avg_data_time_s or 0.0) - med_data
    comp_excess = (view.avg_compute_time_s or 0.0) - med_comp
    why = "data loading" if data_excess >= comp_excess else "compute"
    if cpu_wait is not None:
        why = "waiting for a CPU"
    summary = (
        f"rank {view.rank} is a straggler: its own work is {fmt_s(median + excess)} per step "
        f"against a median of {fmt_s(median)} on the other ranks, mostly {why}"
    )
    evidence = [
        Evidence(
            f"rank {view.rank}: data {fmt_s(view.avg_data_time_s)}, compute "
            f"{fmt_s(view.avg_compute_time_s)}, comm wait {fmt_s(view.avg_comm_wait_s)} "
            f"(median of {view.avg_steps} steps)"
        ),
        Evidence(
            f"other ranks (median): data {fmt_s(med_data)}, compute {fmt_s(med_comp)}"
            + (f", comm wait {fmt_s(statistics.median(comms))}" if comms else "")
            + " — they wait for it in the gradient all-reduce"
        ),
    ]
    if cpu_wait is not None:
        shares = [v.runq_share for v in others if v.runq_share is not None]
        evidence.append(
            Evidence(
                f"rank {view.rank} waited for a CPU {fmt_s(cpu_wait)} a step (ready to run "
                f"{view.runq_share or 0.0:.0%} of the time, not running); the other ranks "
                f"{statistics.median(shares) if shares else 0.0:.0%}: another process on its cores"
            )
        )
    fix = {"data loading": FIX_DATA, "compute": FIX_COMPUTE}.get(why, FIX_CPU)
    return Finding(
        id="straggler",
        severity=Severity.WARNING,
        summary=summary,
        fix=fix,
        ranks=(view.rank,),
        evidence=tuple(evidence),
    )
