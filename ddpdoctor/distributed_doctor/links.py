"""Judging the collective check on rank 0: all_reduce correctness and bandwidth, and the one slow
or broken link in the pairwise matrix. Pure functions of the results every rank sent."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.distributed_doctor.bench_model import PairResult, RankBench, bus_bandwidth
from ddpdoctor.distributed_doctor.nodes import NodeMap
from ddpdoctor.distributed_doctor.results import cluster_result
from ddpdoctor.rank_ranges import fold_ranks

# A link below this fraction of the median is reported; healthy fabrics stay well within 2x.
SLOW_FRACTION = 0.5
# Below this many measured links a median says little, so only broken links are reported.
MIN_LINKS_FOR_MEDIAN = 3


def judge_allreduce(benches: Sequence[RankBench], world: int, nodes: NodeMap) -> CheckResult:
    title = "all_reduce across all ranks"
    failed = [b for b in benches if b.allreduce.error]
    if failed:
        first = failed[0]
        return cluster_result(
            "cluster.allreduce",
            title,
            Status.FAIL,
            f"all_reduce failed on {nodes.describe([b.rank for b in failed])}: "
            f"{first.allreduce.error}",
            fix="Look at the network between those nodes (firewall, interface, MTU) and at "
            "NCCL_DEBUG=INFO output; ranks that cannot all_reduce cannot train.",
            details=[f"rank {b.rank}: {b.allreduce.error}" for b in failed],
        )
    wrong = [b for b in benches if not b.allreduce.correct]
    if wrong:
        culprits = sorted({r for b in wrong for r in b.allreduce.bad_ranks})
        seen_on = fold_ranks(b.rank for b in wrong)
        sample = next((b.allreduce.first_error for b in wrong if b.allreduce.first_error), "")
        named = f"the data of {nodes.describe(culprits)}" if culprits else "the result"
        return cluster_result(
            "cluster.allreduce",
            title,
            Status.FAIL,
            f"all_reduce completed with wrong data: {named} came back wrong (seen on ranks "
            f"{seen_on}; {sample})",
            fix="Silent corruption usually means broken GPU peer-to-peer or PCIe ACS/IOMMU "
            "settings on that node: retry with NCCL_P2P_DISABLE=1 to confirm, then fix the "
            "platform (disable ACS, update the driver).",
            facts={"bad_ranks": culprits},
        )
    timed = [b.allreduce.seconds for b in benches if b.allreduce.seconds]
    backend = benches[0].backend if benches else "?"
    nbytes = benches[0].allreduce.nbytes if benches else 0
    if not timed:
        return cluster_result("cluster.allreduce", title, Status.PASS, "all_reduce correct")
    seconds = max(timed)  # the slowest rank sets the pace of a collective
    algbw, busbw = bus_bandwidth(nbytes, seconds, world)
    return cluster_result(
        "cluster.allreduce",
        title,
        Status.PASS,
        f"{_size(nbytes)} all_reduce on {world} ranks ({backend}) correct; busbw "
        f"{busbw:.2f} GB/s (algbw {algbw:.2f} GB/s, {seconds * 1e3:.1f} ms)",
        facts={
            "bytes": nbytes,
            "seconds": seconds,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw,
            "backend": backend,
        },
    )


def merge_pairs(benches: Sequence[RankBench]) -> list[PairResult]:
    """One result per pair: a failure seen by either side wins over the other side's timing."""
    merged: dict[tuple[int, int], PairResult] = {}
    for bench in benches:
        for pair in bench.pairs:
            key = (pair.a, pair.b)
            current = merged.get(key)
            if current is None or (pair.error and not current.error):
                merged[key] = pair
            elif not pair.error and not current.error and bench.rank == pair.a:
                merged[key] = pair  # the starting rank timed the full round trip
    participants = sorted({p for b in benches for p in b.participants})
    expected = {(a, b) for i, a in enumerate(participants) for b in participants[i + 1 :]}
    for key in sorted(expected - set(merged)):
        nbytes = benches[0].pairs[0].nbytes if benches and benches[0].pairs else 0
        merged[key] = PairResult(key[0], key[1], nbytes, error="no result from either rank")
    return [merged[key] for key in sorted(merged)]


def judge_links(pairs: Sequence[PairResult], nodes: NodeMap) -> CheckResult:
    title = "Links between nodes (pairwise send/recv)"
    if not pairs:
        return cluster_result(
            "cluster.links",
            title,
            Status.SKIP,
            "one node only: no links between nodes to measure",
        )
    broken = [p for p in pairs if p.error]
    measured = [p for p in pairs if p.gbps is not None]
    median = statistics.median([p.gbps for p in measured if p.gbps]) if measured else None
    slow = []
    if median and len(measured) >= MIN_LINKS_FOR_MEDIAN:
        slow = [p for p in measured if p.gbps is not None and p.gbps < SLOW_FRACTION * median]
    details = [_pair_line(p, nodes) for p in pairs] if len(pairs) > 1 else []
    facts = {"median_gbps": median, "pairs": len(pairs)}
    if broken:
        lines = [f"{_between(p, nodes)}: {p.error}" for p in broken]
        common = _common_node(broken, nodes)
        head = f"{common} on all its failing links; " if common else ""
        return cluster_result(
            "cluster.links",
            title,
            Status.FAIL,
            head + lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""),
            fix="Check that these nodes can reach each other on the interface NCCL/gloo use "
            "(firewall rules for high ports, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, routes); "
            "a link that times out hangs the first collective of the job.",
            details=details,
            facts=facts,
        )
    if slow:
        common = _common_node(slow, nodes)
        first = slow[0]
        head = f"{common} is slow on all its links: " if common and len(slow) > 1 else ""
        return cluster_result(
            "cluster.links",
            title,
            Status.WARN,
            f"{head}{_between(first, nodes)} runs at {first.gbps:.2f} GB/s, below half the "
            f"median {median:.2f} GB/s" + (f" (and {len(slow) - 1} more)" if len(slow) > 1 else ""),
            fix="Look at that link or node: NIC speed and errors (ethtool -S, ibstat), a "
            "different interface chosen by NCCL, or a busy host; every collective runs at the "
            "pace of the slowest link.",
            details=details,
            facts=facts,
        )
    low = min(p.gbps for p in measured if p.gbps is not None)
    high = max(p.gbps for p in measured if p.gbps is not None)
    count = len(pairs)
    summary = f"{count} link{'s' if count != 1 else ''} between {len(nodes)} nodes: "
    if count == 1:
        summary += f"{low:.2f} GB/s"
    else:
        summary += f"median {median:.2f} GB/s (min {low:.2f}, max {high:.2f})"
    return cluster_result(
        "cluster.links", title, Status.PASS, summary, details=details, facts=facts
    )


def links_json(pairs: Sequence[PairResult], nodes: NodeMap) -> list[dict[str, Any]]:
    rows = []
    for p in pairs:
        rows.append(
            {
                "a": p.a,
                "b": p.b,
                "host_a": nodes.node_of(p.a).host,
                "host_b": nodes.node_of(p.b).host,
                "node_a": nodes.node_of(p.a).index,
                "node_b": nodes.node_of(p.b).index,
                "bytes": p.nbytes,
                "seconds": p.seconds,
                "gbps": p.gbps,
                "error": p.error,
            }
        )
    return rows


def _between(pair: PairResult, nodes: NodeMap) -> str:
    return f"{nodes.node_of(pair.a).short} <-> {nodes.node_of(pair.b).short}"


def _pair_line(pair: PairResult, nodes: NodeMap) -> str:
    what = pair.error if pair.error else f"{pair.gbps:.2f} GB/s"
    return f"{_between(pair, nodes)} (ranks {pair.a}, {pair.b}): {what}"


def _common_node(pairs: Sequence[PairResult], nodes: NodeMap) -> str | None:
    """The node present in every pair, when there is exactly one: the node, not a link, is bad."""
    if not pairs:
        return None
    common = set.intersection(
        *({nodes.node_of(p.a).index, nodes.node_of(p.b).index} for p in pairs)
    )
    if len(common) != 1 or len(pairs) < 2:
        return None
    index = common.pop()
    return next(n.short for n in nodes.nodes if n.index == index)


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.0f} KiB"
