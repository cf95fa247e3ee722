"""Rank 0's one report: the merged local results, the cross-node results, and the JSON "cluster"
section; and how it is emitted (text, --json, --junit-xml)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.distributed_doctor.bench_model import RankBench
from ddpdoctor.distributed_doctor.consistency import check_consistency
from ddpdoctor.distributed_doctor.facts import RankFacts
from ddpdoctor.distributed_doctor.links import judge_allreduce, judge_links, links_json, merge_pairs
from ddpdoctor.distributed_doctor.merge import MatrixRow, matrix_json, merge_reports
from ddpdoctor.distributed_doctor.nodes import Member, NodeMap
from ddpdoctor.distributed_doctor.reach_verdict import Reach, judge_reach, reach_json
from ddpdoctor.distributed_doctor.results import cluster_result
from ddpdoctor.launchers.identity import LaunchInfo
from ddpdoctor.launchers.slurm import task_hosts
from ddpdoctor.protocol import jsontext
from ddpdoctor.rank_ranges import fold_ranks

JOIN_FIX = (
    "Start the missing ranks: check that the launcher ran on every node and that each node "
    "reaches MASTER_ADDR:MASTER_PORT (firewall, address, a typo in one node's command). Under "
    "torchrun's c10d rendezvous a node that never comes blocks torchrun itself; bound that wait "
    "with --rdzv-conf join_timeout=<seconds>."
)


@dataclass(frozen=True)
class ClusterOutcome:
    report: DoctorReport
    cluster: dict[str, Any]  # the "cluster" section of --json
    nodes: NodeMap
    matrix: list[MatrixRow]
    launcher: str
    world_size: int


def join_failed(
    info: LaunchInfo,
    local: DoctorReport,
    reason: str,
    missing: Sequence[int],
    records: Mapping[int, Mapping[str, Any]],
    strict: bool,
    *,
    timeout_s: float | None = None,
    elapsed_s: float | None = None,
    master_error: str | None = None,
) -> ClusterOutcome:
    """Rank 0's report when the ranks never came together: its own results and who is missing."""
    members = [
        Member(rank, rec.get("host", "?"), rec.get("node_rank"), rec.get("boot_id"))
        for rank, rec in sorted(records.items())
    ] or [Member(0, local.host, info.node_rank)]
    nodes = NodeMap.build(members)
    merged, matrix = merge_reports({0: local.to_json()}, nodes)
    absent = [r for r in missing if r not in records]  # never came (others came but stalled)
    where = _expected_places(absent, info)
    joined = nodes.describe([m.rank for m in members])
    within = f" within {timeout_s:g} s" if absent and timeout_s else ""
    summary = f"{reason}{where}{within}; joined: {joined}"
    details = []
    if master_error:  # the likely cause: the others look for rank 0 somewhere else
        details.append(
            f"{info.addr_var}={info.master_addr} {master_error}: the other ranks look for the "
            "rendezvous there"
        )
    join_result = cluster_result(
        "cluster.join",
        "All ranks joined",
        Status.FAIL,
        summary,
        fix=JOIN_FIX,
        details=details,
        facts={"missing_ranks": list(missing), "joined_ranks": sorted(records)},
    )
    elapsed = local.elapsed_s if elapsed_s is None else elapsed_s
    report = DoctorReport.build([*merged, join_result], strict=strict, elapsed_s=elapsed)
    section = _section(info, nodes, matrix, missing=missing)
    return ClusterOutcome(report, section, nodes, matrix, info.launcher, info.world_size)


def joined_ok(
    info: LaunchInfo,
    payloads: Sequence[Mapping[str, Any] | None],
    benches: Sequence[Mapping[str, Any] | None] | None,
    *,
    join_s: float,
    group_error: str | None,
    group_s: float | None,
    strict: bool,
    elapsed_s: float,
    reach: Reach | None = None,
    group_blocked: bool = False,
    timeout_s: float | None = None,
) -> ClusterOutcome:
    present = [p for p in payloads if p]
    facts = [RankFacts.from_json(p["facts"]) for p in present]
    nodes = NodeMap.build(Member(f.rank, f.host, f.node_rank, f.boot_id) for f in facts)
    merged, matrix = merge_reports({p["rank"]: p["report"] for p in present}, nodes)
    consistency = check_consistency(facts, nodes)
    reached = judge_reach(reach, nodes) if reach is not None and reach.infos else None
    if reached is not None:  # what reaches replaces what is merely present
        consistency = [reached if r.id == "cluster.ifname" else r for r in consistency]
    group = _group_result(info, present, group_error, group_s, nodes)
    if group_error and reached is not None and reached.status is Status.FAIL:
        group = replace(group, fix=reached.fix)  # the probe knows why, better than a guess
    if group_blocked:
        group = replace(
            group, summary=f"the ranks joined, but a gloo process group cannot form: {group_error}"
        )
    results: list[CheckResult] = [
        cluster_result(
            "cluster.join",
            "All ranks joined",
            Status.PASS,
            f"all {info.world_size} ranks joined in {join_s:.1f} s",
        ),
        group,
        *consistency,
    ]
    rank_benches = [RankBench.from_json(b) for b in benches or () if b]
    pairs = merge_pairs(rank_benches)
    if group_error is None and rank_benches:
        results.append(judge_allreduce(rank_benches, info.world_size, nodes))
        results.append(judge_links(pairs, nodes))
    report = DoctorReport.build([*merged, *results], strict=strict, elapsed_s=elapsed_s)
    section = _section(info, nodes, matrix, facts=facts, links=links_json(pairs, nodes))
    section["reach"] = reach_json(reach) if reach is not None else None
    section["timeout_s"] = timeout_s
    allreduce = next((r for r in results if r.id == "cluster.allreduce"), None)
    section["allreduce"] = dict(allreduce.facts) if allreduce else None
    return ClusterOutcome(report, section, nodes, matrix, info.launcher, info.world_size)


def emit_outcome(outcome: ClusterOutcome, args: argparse.Namespace) -> None:
    if getattr(args, "junit_xml", None):
        from ddpdoctor.integrations.junit import write_junit

        write_junit(outcome.report, args.junit_xml)
    if args.json:
        document = {**outcome.report.to_json(), "cluster": outcome.cluster}
        sys.stdout.write(jsontext.dumps(document, indent=2) + "\n")
        return
    from ddpdoctor.console import make_console, symbols_for
    from ddpdoctor.distributed_doctor.render import render_distributed

    render_distributed(
        outcome.report,
        nodes=outcome.nodes,
        matrix=outcome.matrix,
        launcher=outcome.launcher,
        world_size=outcome.world_size,
        console=make_console(),
        verbose=args.verbose,
        symbols=symbols_for(sys.stdout),
    )


def _group_result(
    info: LaunchInfo,
    present: Sequence[Mapping[str, Any]],
    error: str | None,
    seconds: float | None,
    nodes: NodeMap,
) -> CheckResult:
    title = "gloo process group"
    if error is None:
        return cluster_result(
            "cluster.group",
            title,
            Status.PASS,
            f"formed on {info.world_size} ranks; every report gathered in {seconds or 0:.1f} s",
        )
    silent = sorted(set(range(info.world_size)) - {p["rank"] for p in present})
    unheard = f"; no report from {nodes.describe(silent)}" if silent and len(nodes) else ""
    return cluster_result(
        "cluster.group",
        title,
        Status.FAIL,
        f"the ranks joined but could not form a gloo process group: {error}{unheard}",
        fix="gloo connects every pair of ranks on the address each host name resolves to: make "
        "each node's host name resolve to an address the others can reach (not 127.0.1.1), or "
        "set GLOO_SOCKET_IFNAME to the interface the nodes share.",
    )


def _expected_places(missing: Sequence[int], info: LaunchInfo) -> str:
    if not missing:
        return ""
    if info.launcher == "slurm":
        hosts = task_hosts(os.environ)
        if hosts and all(r < len(hosts) for r in missing):
            places = sorted({hosts[r] for r in missing})
            return f" (expected on {', '.join(places)})"
    if info.local_world_size:
        nodes = sorted({r // info.local_world_size for r in missing})
        label = "node" if len(nodes) == 1 else "nodes"
        return f" (expected on {label} {fold_ranks(nodes)})"
    return ""


def _section(
    info: LaunchInfo,
    nodes: NodeMap,
    matrix: Sequence[MatrixRow],
    *,
    missing: Sequence[int] = (),
    facts: Sequence[RankFacts] = (),
    links: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "launcher": info.launcher,
        "world_size": info.world_size,
        "joined": sum(len(n.ranks) for n in nodes.nodes),
        "missing_ranks": list(missing),
        "master": f"{info.master_addr}:{info.master_port}",
        "nodes": [
            {"node": n.index, "host": n.host, "node_rank": n.node_rank, "ranks": list(n.ranks)}
            for n in nodes.nodes
        ],
        "matrix": matrix_json(matrix),
        "ranks": [_rank_json(f, nodes) for f in facts],
        "allreduce": None,
        "links": links or [],
    }


def _rank_json(facts: RankFacts, nodes: NodeMap) -> dict[str, Any]:
    data = facts.to_json()
    data["node"] = nodes.node_of(facts.rank).index
    return data
