"""`ddpdoctor doctor --distributed`: the doctor on every node of a job, reported once by rank 0.

Started by the launcher people already use (torchrun, srun, mpirun), every rank:

1. runs its local checks (without the smoke group: the collective check below replaces it, and
   local smoke tests on every rank would fight over ports and GPUs);
2. joins the others through a TCPStore (join.py) with a deadline, so rank 0 names missing ranks;
3. on several nodes, finds which addresses of each node the others reach (reach_phase.py), so a
   gloo group that cannot form is named, with its cause, instead of waited for;
4. sends its report and facts to rank 0 over a gloo process group (gather_object);
5. runs the collective check: all_reduce correctness and busbw, and the pairwise link matrix.

Rank 0 then prints ONE report (text, or --json with a "cluster" section); the other ranks print
nothing and exit with rank 0's exit code.

`--timeout T` bounds the whole run, not one wait: every phase gets what is left of T, and a
call into gloo that overruns it is abandoned (the process then ends with os._exit, since the
stuck C++ thread would hold the interpreter's exit), so the report comes by T plus a few seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.registry import Check, select_checks
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_check_list
from ddpdoctor.console import error_line
from ddpdoctor.distributed_doctor import join, names, rank_setup, reach_phase
from ddpdoctor.distributed_doctor.exchange import gather_reports, run_collective_check
from ddpdoctor.distributed_doctor.facts import (
    RESOLVE_TIMEOUT_S,
    RankFacts,
    boot_id,
    collect_rank_facts,
)
from ddpdoctor.distributed_doctor.nodes import Member, NodeMap
from ddpdoctor.distributed_doctor.rank_setup import (
    FOLLOW_GRACE_S,
    SLACK_S,
    Setup,
    Store,
)
from ddpdoctor.distributed_doctor.reach_verdict import Reach, group_blocker
from ddpdoctor.distributed_doctor.verdict import (
    ClusterOutcome,
    emit_outcome,
    join_failed,
    joined_ok,
)
from ddpdoctor.launchers.identity import LaunchInfo, detect_launch
from ddpdoctor.rank_ranges import fold_ranks


def main(args: argparse.Namespace, options: DoctorOptions) -> int:
    """`doctor --distributed` on one rank; `options` are the doctor's flags (the smoke test is
    replaced by the cross-node checks)."""
    info = detect_launch(
        os.environ,
        master_addr=args.master_addr,
        master_port=args.master_port,
        init_method=args.init_method,
    )
    options = replace(options, smoke=False)
    checks = local_checks(args.check_ids)
    if info.is_rank0 and args.junit_xml:
        from ddpdoctor.integrations.junit import check_junit_path

        check_junit_path(args.junit_xml)  # a bad path is a usage error before anyone waits
    context = CheckContext(env=names.checks_env(info), options=options)
    # c10d logs every failed connect with a C++ stack; the report says it in one line instead.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    import torch
    import torch.distributed as dist

    # The clock starts once torch is loaded (seconds on a busy machine): T bounds the waits.
    deadline = time.monotonic() + float(args.timeout)
    setup = Setup(info, checks, context, float(args.timeout), bool(args.strict), deadline)

    outcome = run_rank(setup, dist, torch)
    if outcome.outcome is not None:
        emit_outcome(outcome.outcome, args)
    elif outcome.message:
        print(error_line(f"rank {info.rank}: {outcome.message}"), file=sys.stderr)
    # A gloo call or a name lookup stuck in C past the deadline would hold the interpreter's
    # exit (a lookup that a dead DNS server never answers, for tens of seconds): end at once.
    if rank_setup.ABANDONED or rank_setup.stuck_threads():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(outcome.code)
    return outcome.code


def local_checks(ids: list[str] | None) -> list[Check]:
    """The checks each rank runs: all but the smoke group, or those named. "cluster" names only
    the cross-node checks, which always run."""
    wanted = [i for i in ids or [] if i != "cluster" and not i.startswith("cluster.")]
    if ids and not wanted:
        return []
    chosen = select_checks(wanted or None, smoke=False)
    return [c for c in chosen if c.group != "smoke"]


@dataclass(frozen=True)
class RankResult:
    code: int
    outcome: ClusterOutcome | None = None  # rank 0's report
    message: str | None = None  # the one line another rank prints when it cannot go on


def run_rank(setup: Setup, dist: Any, torch: Any) -> RankResult:
    info = setup.info
    start = time.monotonic()
    local: DoctorReport | None = None
    base: Any = None
    hosting = info.is_rank0 and not info.agent_store
    if hosting:
        local = run_local(setup)  # before the store takes MASTER_PORT: the port check sees it free
        try:
            base = join.host_store(dist, info, setup.timeout_s * 2 + SLACK_S)
        except join.JoinError as exc:
            return RankResult(1, join_failed(info, local, str(exc), (), {}, setup.strict))
    reached: join.Reached | None = None
    master_error: str | None = None
    try:
        # Rank 0 serving the store waits for its own name as long as the others may (a pod's
        # name appears late), then gives its own port 3 s: it answers at once or not at all.
        reached = join.wait_until_reached(
            info.master_addr,
            info.master_port,
            setup.deadline,
            connect_within=3.0 if hosting else None,
            names=f"{info.addr_var}:{info.port_var}",
        )
    except join.JoinError as exc:
        if hosting and exc.unresolved:
            return _unresolved_here(setup, dist, torch, base, local or run_local(setup), exc, start)
        if hosting:  # our own store does not answer at MASTER_ADDR: it names another host
            master_error = f"does not reach this host (rank 0) on port {info.master_port}"
        elif info.is_rank0:
            return RankResult(
                1, join_failed(info, run_local(setup), str(exc), (), {}, setup.strict)
            )
        else:
            return RankResult(1, message=str(exc))
    if base is None:
        try:
            address = reached.address if reached is not None else None
            base = join.connect_store(dist, info, setup.timeout_s * 2 + SLACK_S, address)
        except join.JoinError as exc:
            return RankResult(1, message=str(exc))
    store = join.prefixed(dist, base, info, "doctor")
    if info.is_rank0:
        return _after_connect(setup, dist, torch, store, base, local, reached, master_error, start)
    try:
        return _after_connect(setup, dist, torch, store, base, local, reached, master_error, start)
    except RuntimeError as exc:  # DistError and friends: rank 0's store went away
        _teardown(dist)
        where = f"{info.master_addr}:{info.master_port}"
        return RankResult(1, message=f"lost rank 0's store at {where}: {join.first_line(exc)}")


def _unresolved_here(
    setup: Setup,
    dist: Any,
    torch: Any,
    base: Store,
    local: DoctorReport,
    exc: join.JoinError,
    start: float,
) -> RankResult:
    """Rank 0 serves the store but never resolved MASTER_ADDR by the deadline: whoever joined
    is told to stop, and the report says why."""
    info = setup.info
    store = join.prefixed(dist, base, info, "doctor")
    join.announce(store, info.rank, _join_record(info, torch, dist))
    missing = join.await_joins(store, info.world_size, time.monotonic())  # no wait: it is late
    records = join.joined_records(store, info.world_size, missing)
    problem = names.unresolved_here(setup.timeout_s, exc.why)
    if missing:  # the others may look for the same name: who never came leads the report
        verdict = _verdict(info, missing, records)
    else:
        verdict = join.Verdict(False, reason=names.unresolved_reason(info, problem))
    join.publish_verdict(store, verdict)
    return _stopped(setup, store, local, verdict, records, start, problem if missing else None)


def _stopped(
    setup: Setup,
    store: Store,
    local: DoctorReport,
    verdict: join.Verdict,
    records: dict,
    start: float,
    master_error: str | None,
) -> RankResult:
    """Rank 0 told the others to stop: its report of who joined and why not."""
    outcome = join_failed(
        setup.info,
        local,
        verdict.reason,
        verdict.missing,
        records,
        setup.strict,
        timeout_s=setup.timeout_s,
        elapsed_s=time.monotonic() - start,
        master_error=master_error,
    )
    _close(setup, store, outcome.report.exit_code, expected=len(records) - 1)
    return RankResult(int(outcome.report.exit_code), outcome)


def _after_connect(
    setup: Setup,
    dist: Any,
    torch: Any,
    store: Store,
    base: Store,
    local: DoctorReport | None,
    reached: join.Reached | None,
    master_error: str | None,
    start: float,
) -> RankResult:
    """Announce, check, describe this rank, then lead (rank 0) or follow."""
    info = setup.info
    join.announce(store, info.rank, _join_record(info, torch, dist))  # here before checking
    if local is None:
        local = run_local(setup)
    if reached is not None:  # a name check that looked before the name appeared looks again
        local = names.recheck_names(setup, local, reached.name_wait_s)
    facts = collect_rank_facts(
        rank=info.rank,
        local_rank=info.local_rank,
        node_rank=info.node_rank,
        master_addr=info.master_addr,
        master_port=info.master_port,
        env=setup.context.env,
        master_connect_ms=reached.connect_ms if reached is not None else None,
        resolved=reached.addresses if reached is not None else None,
        master_var=info.addr_var,
    )
    if master_error:
        facts = replace(facts, master_error=master_error)
    if reached is not None and reached.name_wait_s is not None:
        facts = replace(facts, master_name_wait_s=round(reached.name_wait_s, 1))
    join.mark_ready(store, info.rank)
    if info.is_rank0:
        return _lead(setup, dist, torch, base, store, local, facts, start)
    return _follow(setup, dist, torch, base, store, local, facts)


def run_local(setup: Setup) -> DoctorReport:
    start = time.monotonic()
    results = run_check_list(setup.checks, setup.context)
    return DoctorReport.build(results, strict=setup.strict, elapsed_s=time.monotonic() - start)


def _lead(
    setup: Setup,
    dist: Any,
    torch: Any,
    base: Store,
    store: Store,
    local: DoctorReport,
    facts: RankFacts,
    start: float,
) -> RankResult:
    info = setup.info
    join_started = time.monotonic()
    missing = join.await_joins(store, info.world_size, setup.deadline)
    records = join.joined_records(store, info.world_size, missing)
    verdict = _verdict(info, missing, records, setup.context.options.backend)
    if verdict.go:
        # Every rank is here; each runs its checks before it is ready (bounded per check).
        checking = max((c.timeout_s for c in setup.checks), default=0) + RESOLVE_TIMEOUT_S
        ready_by = min(time.monotonic() + checking + SLACK_S, setup.deadline)
        unready = join.await_ready(store, info.world_size, ready_by)
        if unready:
            verdict = join.Verdict(
                False,
                unready,
                f"rank{'s' if len(unready) > 1 else ''} {fold_ranks(unready)} joined but "
                "never finished their local checks",
            )
    join.publish_verdict(store, verdict)
    if not verdict.go:
        return _stopped(setup, store, local, verdict, records, start, facts.master_error)
    join_s = time.monotonic() - join_started
    nodes = _nodes(records)
    reach, form, blocker = _reach(setup, store, verdict, lambda r: group_blocker(r, nodes))
    payloads, group_error, group_s = gather_reports(
        setup, dist, base, store, local, facts, form, blocker
    )
    assert payloads is not None  # rank 0 (the lead) always has them, from the group or the store
    benches = run_collective_check(setup, dist, torch, store, verdict, group_error)
    outcome = joined_ok(
        info,
        payloads or [],
        benches,
        join_s=join_s,
        group_error=group_error,
        group_s=group_s,
        strict=setup.strict,
        elapsed_s=time.monotonic() - start,
        reach=reach,
        group_blocked=not form,
        timeout_s=setup.timeout_s,
    )
    _close(setup, store, outcome.report.exit_code, expected=info.world_size - 1)
    _teardown(dist)
    return RankResult(int(outcome.report.exit_code), outcome)


def _follow(
    setup: Setup,
    dist: Any,
    torch: Any,
    base: Store,
    store: Store,
    local: DoctorReport,
    facts: RankFacts,
) -> RankResult:
    grace = FOLLOW_GRACE_S
    said = reach_phase.read_keys(store, ["start"], setup.deadline + grace).get("start")
    if not isinstance(said, dict):
        return RankResult(1, message="rank 0 gave no verdict in time (rank 0 has the report)")
    verdict = join.verdict_from_json(said)
    if verdict.go:
        _, form, blocker = _reach(setup, store, verdict, None)
        _, group_error, _ = gather_reports(setup, dist, base, store, local, facts, form, blocker)
        run_collective_check(setup, dist, torch, store, verdict, group_error)
    code = reach_phase.read_keys(store, ["exit_code"], setup.deadline + grace + 5).get("exit_code")
    join.acknowledge(store)
    _teardown(dist)
    if not isinstance(code, int):
        return RankResult(1, message="rank 0 gave no exit code in time (rank 0 has the report)")
    if not verdict.go:
        return RankResult(code, message=f"stopped: {verdict.reason} (rank 0 has the report)")
    return RankResult(code)


def _nodes(records: dict) -> NodeMap:
    return NodeMap.build(
        Member(r, rec.get("host", "?"), rec.get("node_rank"), rec.get("boot_id"))
        for r, rec in records.items()
    )


def _reach(
    setup: Setup, store: Store, verdict: join.Verdict, decide: Any
) -> tuple[Reach | None, bool, str | None]:
    """The reachability phase on several nodes; (None, True, None) on one node."""
    if not verdict.leaders:
        return None, True, None
    grace = 0.0 if decide is not None else FOLLOW_GRACE_S
    return reach_phase.run_phase(
        store,
        setup.info.rank,
        verdict.leaders,
        setup.info.run_id,
        setup.context.env,
        setup.deadline + grace,
        decide,
    )


def _verdict(
    info: LaunchInfo, missing: tuple[int, ...], records: dict, requested: str = "auto"
) -> join.Verdict:
    if missing:
        return join.Verdict(
            False,
            missing,
            f"rank{'s' if len(missing) > 1 else ''} {fold_ranks(missing)} never joined",
        )
    worlds = {r: rec.get("world_size") for r, rec in records.items()}
    if len(set(worlds.values())) > 1:
        odd = sorted(r for r, w in worlds.items() if w != info.world_size)
        return join.Verdict(
            False,
            reason=f"WORLD_SIZE differs: ranks {fold_ranks(odd)} expect "
            f"{worlds[odd[0]]}, rank 0 expects {info.world_size}",
        )
    nodes = _nodes(records)
    leaders = [min(n.ranks) for n in nodes.nodes]
    participants = leaders if len(leaders) > 1 else sorted(records)
    # NCCL for the collective check when asked (or on auto) and every rank has a GPU: a group
    # needs the same backend everywhere.
    gpus = all(rec.get("gpu") for rec in records.values())
    backend = "nccl" if gpus and requested in ("auto", "nccl") else "gloo"
    probed = tuple(leaders) if len(leaders) > 1 else ()
    return join.Verdict(True, participants=tuple(participants), backend=backend, leaders=probed)


def _join_record(info: LaunchInfo, torch: Any, dist: Any) -> dict[str, Any]:
    try:
        gpu = bool(torch.cuda.is_available() and dist.is_nccl_available())
    except Exception:  # noqa: BLE001 - no usable CUDA runtime here
        gpu = False
    return {
        "host": socket.gethostname(),
        "node_rank": info.node_rank,
        "boot_id": boot_id(),
        "pid": os.getpid(),
        "world_size": info.world_size,
        "gpu": gpu,
    }


def _close(setup: Setup, store: Store, code: int, *, expected: int) -> None:
    join.publish_exit_code(store, int(code))
    if not setup.info.agent_store:  # rank 0 serves the store: stay until the others read it
        until = min(time.monotonic() + 10, max(time.monotonic() + 1, setup.deadline + 3))
        join.await_acknowledgements(store, expected, until)


def _teardown(dist: Any) -> None:
    """Destroy the process group, bounded: a group with a dead link must not hold the exit."""
    if not dist.is_initialized():
        return
    thread = threading.Thread(target=dist.destroy_process_group, daemon=True)
    thread.start()
    thread.join(5)
