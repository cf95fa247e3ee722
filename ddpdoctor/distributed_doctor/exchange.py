"""The phases of `doctor --distributed` after the join: every rank's report and facts to rank 0
over a gloo group (a copy kept in the store, for a group that cannot form), and the collective
check (all_reduce correctness and busbw, the pairwise links). Each is bounded by the run's one
deadline: a call into gloo that overruns it is abandoned and noted in rank_setup.ABANDONED."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.distributed_doctor import join, rank_setup, reach_phase
from ddpdoctor.distributed_doctor.bench_model import AllReduceResult, RankBench
from ddpdoctor.distributed_doctor.collective_bench import LinkFault, default_config, run_bench
from ddpdoctor.distributed_doctor.facts import RankFacts
from ddpdoctor.distributed_doctor.rank_setup import (
    FOLLOW_GRACE_S,
    GROUP_MIN_S,
    Setup,
    Store,
)
from ddpdoctor.launchers.identity import LaunchInfo


def gather_reports(
    setup: Setup,
    dist: Any,
    base: Store,
    store: Store,
    local: DoctorReport,
    facts: RankFacts,
    form: bool = True,
    blocker: str | None = None,
) -> tuple[list[Any] | None, str | None, float | None]:
    """Every rank's report and facts to rank 0 over gloo; the store keeps a copy in case the
    process group cannot form (then that failure is itself the main finding). The group is not
    tried when the probe showed it cannot form, and is abandoned at the deadline."""
    info = setup.info
    payload = {"rank": info.rank, "facts": facts.to_json(), "report": local.to_json()}
    store.set(f"report/{info.rank}", json.dumps(payload))
    started = time.monotonic()
    error: str | None = None
    gathered: list[Any] | None = None
    if not form:
        error = blocker or "not tried"
    else:
        # A healthy group forms in well under a second; a little past the deadline is allowed
        # so that slow checks never turn a healthy job into a failed one.
        left = max(setup.left(), GROUP_MIN_S)

        def form_and_gather() -> list[Any] | None:
            dist.init_process_group(
                "gloo",
                store=join.prefixed(dist, base, info, "pg"),
                rank=info.rank,
                world_size=info.world_size,
                timeout=timedelta(seconds=max(1.0, left)),
            )
            out: list[Any] | None = [None] * info.world_size if info.is_rank0 else None
            dist.gather_object(payload, out, dst=0)
            return out

        done = bounded_call(form_and_gather, left, name="gloo-group")
        if done.timed_out:
            rank_setup.ABANDONED.append("init_process_group")
            error = f"it did not form within --timeout {setup.timeout_s:g} s"
        elif done.error is not None:  # a group that cannot form is the finding
            error = join.first_line(done.error)
        else:
            gathered = done.value
    if error is None:
        return gathered, None, time.monotonic() - started
    if not info.is_rank0:
        return None, error, None
    return _payloads_from_store(store, info, setup.deadline + 1), error, None


def _payloads_from_store(store: Store, info: LaunchInfo, deadline: float) -> list[Any]:
    found = reach_phase.read_keys(
        store, [f"report/{rank}" for rank in range(info.world_size)], deadline
    )
    return [found.get(f"report/{rank}") for rank in range(info.world_size)]


def run_collective_check(
    setup: Setup,
    dist: Any,
    torch: Any,
    store: Store,
    verdict: join.Verdict,
    group_error: str | None,
) -> list[Any] | None:
    info = setup.info
    bench = None
    if group_error is None:
        device = "cuda" if verdict.backend == "nccl" else "cpu"
        left = setup.left(grace=0.0 if info.is_rank0 else FOLLOW_GRACE_S)
        done = bounded_call(
            lambda: _bench_on_this_rank(setup, dist, torch, verdict), max(left, 0.1), name="bench"
        )
        if done.ok:
            bench = done.value
        else:  # e.g. NCCL cannot start, or a link that stalls (an MTU black hole): the finding
            if done.timed_out:
                rank_setup.ABANDONED.append("collective check")
            why = (
                f"did not finish within --timeout {setup.timeout_s:g} s"
                if done.timed_out
                else join.first_line(done.error or RuntimeError("failed"))
            )
            bench = RankBench(
                info.rank, verdict.backend, device, AllReduceResult(False, 0, error=why)
            )
    store.set(f"bench/{info.rank}", json.dumps(bench.to_json() if bench else None))
    if not info.is_rank0:
        return None
    found = reach_phase.read_keys(
        store, [f"bench/{rank}" for rank in range(info.world_size)], setup.deadline + 1
    )
    return [found.get(f"bench/{rank}") for rank in range(info.world_size)]


def _bench_on_this_rank(setup: Setup, dist: Any, torch: Any, verdict: join.Verdict) -> RankBench:
    info = setup.info
    device, group = "cpu", None
    if verdict.backend == "nccl":
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
        group = dist.new_group(backend="nccl")
    return run_bench(
        dist,
        torch,
        rank=info.rank,
        world=info.world_size,
        participants=list(verdict.participants),
        device=device,
        backend=verdict.backend,
        group=group,
        config=default_config(device.split(":")[0], min(setup.timeout_s, setup.left() + 1)),
        fault=LinkFault.from_env(os.environ),
    )
