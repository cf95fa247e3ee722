"""Cross-rank comparison: what must be the same on every node, and what must differ.

Pure functions of the facts every rank sent (facts.py), so each rule is tested with recorded
facts. Each returns a CheckResult in the "cluster" group; a finding names the odd node out and the
values that differ: "NCCL_IB_DISABLE: 1 on node 1 (vm, rank 1); unset on node 0 (vm, rank 0)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.distributed_doctor.facts import RankFacts
from ddpdoctor.distributed_doctor.nodes import NodeMap
from ddpdoctor.distributed_doctor.results import cluster_result

UNSET = "unset"

# Versions that must match (F25: NCCL or torch differing across nodes hangs or crashes in
# bootstrap) and those where a difference is only suspicious.
VERSIONS_MUST_MATCH = ("torch", "nccl")
VERSIONS_SHOULD_MATCH = ("cuda", "driver", "python", "ddpdoctor")
VERSION_TITLES = {
    "torch": "torch",
    "cuda": "CUDA (torch build)",
    "nccl": "NCCL",
    "driver": "NVIDIA driver",
    "python": "Python",
    "ddpdoctor": "ddpdoctor",
}

# Variables whose difference breaks the job: ranks pick different transports, algorithms or
# buffer sizes and never connect, or wait for a rendezvous that is not theirs.
ENV_MUST_MATCH = {
    "NCCL_IB_DISABLE": "a node on InfiniBand and a node on sockets cannot connect",
    "NCCL_NET": "ranks on different network transports cannot connect",
    "NCCL_NET_PLUGIN": "a net plugin on only some nodes makes NCCL hang at init",
    "NCCL_SOCKET_FAMILY": "IPv4 ranks cannot reach IPv6 ranks",
    "NCCL_ALGO": "ranks running different algorithms hang in the first collective",
    "NCCL_PROTO": "ranks running different protocols hang in the first collective",
    "NCCL_BUFFSIZE": "ranks with different buffer sizes corrupt or hang collectives",
    "WORLD_SIZE": "ranks waiting for different world sizes never finish the rendezvous",
    "MASTER_PORT": "ranks looking for different rendezvous ports never meet",
}
# Per-node by nature: paths, debug levels, interface and HCA names (checked by cluster.ifname),
# the master's name as each node writes it (its address is compared by cluster.master_addr).
ENV_MAY_DIFFER = frozenset(
    {
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "NCCL_TOPO_FILE",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "MASTER_ADDR",
        "LOCAL_WORLD_SIZE",
    }
)


def check_consistency(facts: Sequence[RankFacts], nodes: NodeMap) -> list[CheckResult]:
    """Every cross-rank rule, in report order."""
    rules: list[Callable[[Sequence[RankFacts], NodeMap], CheckResult]] = [
        check_hostnames,
        check_versions,
        check_env,
        check_ifname,
        check_master_addr,
        check_gpus,
    ]
    return [rule(facts, nodes) for rule in rules]


def check_hostnames(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """F13: distinct machines must have distinct host names; node ranks must be unique (F07)."""
    title = "Host names unique"
    duplicates = nodes.duplicate_node_ranks()
    if duplicates:
        rank, claimants = next(iter(sorted(duplicates.items())))
        names = " and ".join(n.host for n in claimants)
        return cluster_result(
            "cluster.hostnames",
            title,
            Status.FAIL,
            f"node rank {rank} is claimed by {names}: two nodes were started with the same "
            "--node-rank",
            fix="Give every node its own --node-rank 0..N-1 (or use --rdzv-backend c10d, which "
            "assigns them).",
        )
    by_host: dict[str, list[Any]] = {}
    for node in nodes.nodes:
        by_host.setdefault(node.host, []).append(node)
    shared = {host: group for host, group in by_host.items() if len(group) > 1}
    if not shared:
        return cluster_result(
            "cluster.hostnames",
            title,
            Status.PASS,
            f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, each with its own host name",
        )
    host, group = next(iter(shared.items()))
    labels = " and ".join(n.label for n in group)
    boots = {n.boot_id for n in group}
    if len(boots) > 1 or None in boots:
        return cluster_result(
            "cluster.hostnames",
            title,
            Status.FAIL,
            f"different machines share the host name {host}: {labels}",
            fix="Give every node a unique host name (hostnamectl set-hostname ...): NCCL takes "
            "ranks on hosts with the same name for local peers and tries shared memory or P2P "
            "between machines. Common with cloned VMs and containers.",
            facts={"host": host, "nodes": [n.index for n in group]},
        )
    return cluster_result(
        "cluster.hostnames",
        title,
        Status.WARN,
        f"{labels} run on one machine ({host})",
        fix="Fine for a test on one machine. In a real job, start one launcher per node: two "
        "launchers on one host usually mean a node was started twice and another not at all.",
        facts={"host": host, "nodes": [n.index for n in group]},
    )


def check_versions(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """F25: torch and NCCL must match on every node; CUDA, driver, Python and ddpdoctor should."""
    title = "Software versions match"
    problems: list[tuple[Status, str]] = []
    for key in (*VERSIONS_MUST_MATCH, *VERSIONS_SHOULD_MATCH):
        values = {f.rank: f.versions.get(key) for f in facts}
        if len(set(values.values())) > 1:
            status = Status.FAIL if key in VERSIONS_MUST_MATCH else Status.WARN
            problems.append((status, f"{VERSION_TITLES[key]}: {describe_values(values, nodes)}"))
    if not problems:
        sample = facts[0].versions
        shown = ", ".join(
            f"{VERSION_TITLES[k]} {sample[k]}" for k in VERSION_TITLES if sample.get(k) is not None
        )
        return cluster_result("cluster.versions", title, Status.PASS, f"{shown} on every rank")
    return _worst_of(
        "cluster.versions",
        title,
        problems,
        fix="Run the same software on every node: one container image or environment, with the "
        "torch and nvidia-nccl wheels pinned; a node with another NCCL hangs or crashes in "
        "bootstrap.",
    )


def check_env(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """NCCL_* and GLOO_* settings (and the launch variables) must agree across ranks."""
    title = "NCCL and GLOO settings match"
    names = sorted({name for f in facts for name in f.env})
    problems: list[tuple[Status, str]] = []
    harmless: list[str] = []
    reasons: list[str] = []
    for name in names:
        values = {f.rank: f.env.get(name) for f in facts}
        if len(set(values.values())) <= 1:
            continue
        line = f"{name}: {describe_values(values, nodes)}"
        if name in ENV_MAY_DIFFER:
            harmless.append(f"{line} (may differ per node)")
        elif name in ENV_MUST_MATCH:
            problems.append((Status.FAIL, line))
            reasons.append(ENV_MUST_MATCH[name])
        else:
            problems.append((Status.WARN, line))
    if not problems:
        compared = len([n for n in names if n not in ENV_MAY_DIFFER])
        return cluster_result(
            "cluster.env",
            title,
            Status.PASS,
            f"{compared} variable{'s' if compared != 1 else ''} set alike on every rank",
            details=harmless,
        )
    reason = f" ({reasons[0]})" if reasons else ""
    return _worst_of(
        "cluster.env",
        title,
        problems,
        fix=f"Export the same NCCL_*/GLOO_* values on every node{reason}: set them in the job "
        "script or the launcher command, not in one node's shell profile or /etc/nccl.conf.",
        extra_details=harmless,
    )


def check_ifname(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """F14/F16: the interfaces named by NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME exist everywhere."""
    title = "Socket interfaces present on every node"
    failing: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    checked = False
    for f in facts:
        if not f.interfaces:
            continue  # interfaces unknown on that rank: nothing to compare against
        nccl = f.env.get("NCCL_SOCKET_IFNAME")
        if nccl:
            checked = True
            if not nccl_ifname_matches(nccl, f.interfaces):
                failing.setdefault(("NCCL_SOCKET_IFNAME", nccl, f.interfaces), []).append(f.rank)
        gloo = f.env.get("GLOO_SOCKET_IFNAME")
        if gloo:
            checked = True
            if any(name.strip() not in f.interfaces for name in gloo.split(",")):
                failing.setdefault(("GLOO_SOCKET_IFNAME", gloo, f.interfaces), []).append(f.rank)
    if failing:
        problems = [
            (
                Status.FAIL,
                f"{var}={value} matches no usable interface on {nodes.describe(ranks)} "
                f"(it has {', '.join(present)})",
            )
            for (var, value, present), ranks in failing.items()
        ]
        return _worst_of(
            "cluster.ifname",
            title,
            problems,
            fix="Name interfaces that exist on every node: NCCL_SOCKET_IFNAME takes prefixes "
            "(e.g. NCCL_SOCKET_IFNAME=ib,eth covers ib0 and eth0) or ^exclusions; "
            "GLOO_SOCKET_IFNAME takes exact names only.",
        )
    if not checked:
        return cluster_result(
            "cluster.ifname",
            title,
            Status.PASS,
            "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset: NCCL and gloo pick an interface "
            "on each node",
        )
    return cluster_result(
        "cluster.ifname", title, Status.PASS, "the named interfaces exist on every node"
    )


def check_master_addr(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """F10: MASTER_ADDR resolves, to the same address, and is reachable from every node."""
    title = "MASTER_ADDR reachable from every node"
    errors: dict[tuple[str, str], list[int]] = {}
    for f in facts:
        if f.master_error:
            errors.setdefault((f.master_addr, f.master_error), []).append(f.rank)
    if errors:
        var = facts[0].master_var
        lines = [
            (Status.FAIL, f"{var}={addr} {error} on {nodes.describe(ranks)}")
            for (addr, error), ranks in errors.items()
        ]
        return _worst_of(
            "cluster.master_addr",
            title,
            lines,
            fix="Use a MASTER_ADDR every node resolves the same way: the IP address of rank 0's "
            "node on the network the nodes share (not localhost, not a name only one node's "
            "/etc/hosts knows).",
        )
    resolved = {f.rank: ", ".join(f.master_resolved) or None for f in facts}
    reached = [f.master_connect_ms for f in facts if f.master_connect_ms is not None]
    slowest = max(reached) if reached else None
    timing = f"; slowest connect {slowest:.1f} ms" if slowest is not None else ""
    late = {f.rank: f.master_name_wait_s for f in facts if f.master_name_wait_s is not None}
    if late:
        worst = max(late.values())
        timing += (
            f"; the name did not resolve for {worst:.1f} s on {nodes.describe(sorted(late))} "
            "before it did (retried within --timeout: a Kubernetes headless service's name "
            "appears once its pod is ready)"
        )
    addr = facts[0].master_addr
    if len(set(resolved.values())) > 1 and len(nodes) > 1:
        return cluster_result(
            "cluster.master_addr",
            title,
            Status.WARN,
            f"{facts[0].master_var} resolves differently: {describe_values(resolved, nodes)}",
            fix="Give MASTER_ADDR as the IP address of rank 0's node so every node reaches the "
            "same interface.",
        )
    shown = resolved[facts[0].rank] or "?"
    return cluster_result(
        "cluster.master_addr",
        title,
        Status.PASS,
        f"{facts[0].master_var} {addr} ({shown}) reached from all {len(facts)} ranks{timing}",
        facts={
            "resolved": list(facts[0].master_resolved),
            "slowest_connect_ms": slowest,
            "name_wait_s": {str(r): s for r, s in late.items()},
        },
    )


def check_gpus(facts: Sequence[RankFacts], nodes: NodeMap) -> CheckResult:
    """F19: no two ranks on one machine may drive the same GPU."""
    title = "One GPU per rank"
    with_gpu = [f for f in facts if f.gpu_uuid]
    if not with_gpu:
        return cluster_result(
            "cluster.gpus",
            title,
            Status.SKIP,
            "no rank sees a GPU: the job runs on the CPU with gloo",
        )
    owners: dict[tuple[str, str], list[int]] = {}
    for f in with_gpu:
        machine = f.boot_id or f.host
        owners.setdefault((machine, f.gpu_uuid or ""), []).append(f.rank)
    shared = [(uuid, ranks) for (_, uuid), ranks in owners.items() if len(ranks) > 1]
    if shared:
        problems = [
            (Status.FAIL, f"{uuid} is used by {nodes.describe(ranks)}") for uuid, ranks in shared
        ]
        return _worst_of(
            "cluster.gpus",
            title,
            problems,
            fix="Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA work "
            "(or init_process_group(device_id=...)), and check CUDA_VISIBLE_DEVICES: NCCL "
            "aborts with 'Duplicate GPU detected'.",
        )
    without = [f.rank for f in facts if not f.gpu_uuid]
    if without:
        return cluster_result(
            "cluster.gpus",
            title,
            Status.WARN,
            f"{nodes.describe(without)} see no GPU while other ranks do",
            fix="Check CUDA_VISIBLE_DEVICES and the driver on those nodes; a job mixing GPU and "
            "CPU ranks cannot use NCCL.",
        )
    return cluster_result(
        "cluster.gpus",
        title,
        Status.PASS,
        f"{len(with_gpu)} ranks on {len(with_gpu)} distinct GPUs",
    )


def nccl_ifname_matches(spec: str, names: Iterable[str]) -> list[str]:
    """The interfaces NCCL would accept for NCCL_SOCKET_IFNAME=spec (prefix match by default,
    `^` excludes, `=` asks for exact names)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    patterns = [p.strip() for p in spec.split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [n for n in names if hit(n) != exclude]


def describe_values(values: dict[int, Any], nodes: NodeMap) -> str:
    """Ranks grouped by value, the rarest value first: "1 on node 1 (vm, rank 1); unset on ..."."""
    groups: dict[str, list[int]] = {}
    for rank, value in values.items():
        groups.setdefault(UNSET if value is None else str(value), []).append(rank)
    # The odd one out first: the rarest value; on a tie, rank 0's value is the reference and
    # comes last (then a value someone set before "unset").
    reference = min(values) if values else 0
    ordered = sorted(
        groups.items(),
        key=lambda item: (len(item[1]), reference in item[1], item[0] == UNSET, min(item[1])),
    )
    return "; ".join(f"{value} on {nodes.describe(ranks)}" for value, ranks in ordered)


def _worst_of(
    check_id: str,
    title: str,
    problems: Sequence[tuple[Status, str]],
    *,
    fix: str,
    extra_details: Sequence[str] = (),
) -> CheckResult:
    worst = max(problems, key=lambda p: p[0].severity)
    more = len(problems) - 1
    summary = worst[1] + (f" (and {more} more)" if more else "")
    details = [line for _, line in problems] if more else []  # one problem: the summary says it
    return cluster_result(
        check_id,
        title,
        worst[0],
        summary,
        details=details + list(extra_details),
        fix=fix,
    )
