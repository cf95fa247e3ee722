"""Judging the reachability probe (reach.py) on rank 0: per node, the interfaces every other node
reaches; the GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME value that works on all of them; and whether
gloo's own choice of address on each node will let the process group form at all.

Pure functions of what the node leaders published: `infos` maps a leader's rank to its
`describe_self` record (with its GLOO_/NCCL_SOCKET_IFNAME added), `probes` are everyone's connects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.distributed_doctor.nodes import NodeMap
from ddpdoctor.distributed_doctor.reach import BULK_BYTES, Probe
from ddpdoctor.distributed_doctor.results import cluster_result

TITLE = "Interface that reaches every node"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Reach:
    """What rank 0 learnt: each leader's record and every probe."""

    infos: Mapping[int, Mapping[str, Any]]
    probes: Sequence[Probe]
    missing: tuple[int, ...] = ()  # leaders whose record or results never came

    def misses(self, dst: int, iface: str, *, addr: str | None = None) -> dict[int, str]:
        """Leaders that tried and could not reach `dst` on `iface` (or at `addr`): {src: why}.
        A leader whose results never came is in `missing`, not here: no guess either way."""
        out: dict[int, str] = {}
        for src in sorted(self.infos):
            if src == dst or src in self.missing:
                continue
            mine = [
                p
                for p in self.probes
                if p.src == src and p.dst == dst and (p.addr == addr if addr else p.iface == iface)
            ]
            if mine and not any(p.ok for p in mine):
                out[src] = mine[0].error or "no answer"
        return out

    def stalls(self, dst: int, iface: str, *, addr: str | None = None) -> dict[int, str]:
        """Leaders that reached `dst` on `iface` but whose bulk transfer from it stalled."""
        out: dict[int, str] = {}
        for src in sorted(self.infos):
            if src == dst or src in self.missing:
                continue
            mine = [
                p
                for p in self.probes
                if p.src == src and p.dst == dst and (p.addr == addr if addr else p.iface == iface)
            ]
            if any(p.ok for p in mine) and not any(p.ok and p.bulk is not False for p in mine):
                out[src] = (
                    f"connects, but {BULK_BYTES // 1024} KiB sent back in 4 KiB messages never "
                    "arrived: large packets are lost on the way"
                )
        return out

    def ifaces(self, rank: int) -> list[str]:
        names: list[str] = []
        for a in self.infos[rank].get("addresses") or ():
            if a["iface"] not in names:
                names.append(a["iface"])
        return names

    def reaching(self, rank: int) -> list[str]:
        """Interfaces of `rank`'s node that every other node reaches (loopback never does)."""
        return [
            i
            for i in self.ifaces(rank)
            if not _loopback(i) and not self.misses(rank, i) and not self.stalls(rank, i)
        ]

    def any_stall(self) -> bool:
        return any(self.stalls(r, i) for r in self.infos for i in self.ifaces(r))

    def common(self) -> list[str]:
        """Interface names that reach every node on every node: the value for *_SOCKET_IFNAME."""
        leaders = sorted(self.infos)
        if not leaders:
            return []
        sets = [set(self.reaching(r)) for r in leaders]
        return [i for i in self.reaching(leaders[0]) if all(i in s for s in sets)]


def _loopback(iface: str) -> bool:
    return iface == "lo" or iface.startswith("lo:")


def group_blocker(reach: Reach, nodes: NodeMap) -> str | None:
    """Why gloo's full mesh cannot form, from gloo's own choice of address on each node, or None."""
    for rank in sorted(reach.infos):
        gloo = reach.infos[rank].get("gloo") or {}
        where = nodes.short_of(rank)
        if gloo.get("error"):
            return f"{gloo.get('source')} on {where}: {gloo['error']}"
        addr = gloo.get("addr")
        if not addr:
            continue
        iface = gloo.get("iface") or ""
        misses = reach.misses(rank, iface, addr=addr)
        verb = "cannot reach"
        if not misses:
            misses, verb = reach.stalls(rank, iface, addr=addr), "cannot use"
        if misses:
            src, why = next(iter(misses.items()))
            return (
                f"gloo on {where} listens on {addr} ({_source(gloo)}), which "
                f"{nodes.short_of(src)} {verb}: {why}"
            )
    return None


def _source(gloo: Mapping[str, Any]) -> str:
    source = str(gloo.get("source") or "")
    return source if source.startswith(("GLOO_", "loopback")) else f"what {source} resolves to"


def judge_reach(reach: Reach, nodes: NodeMap) -> CheckResult:
    common = reach.common()
    problems = _configured_problems(reach, nodes)
    blocker = group_blocker(reach, nodes)
    if blocker and not any(v.startswith("GLOO_SOCKET_IFNAME") for v in problems):
        problems.insert(0, blocker)
    per_node = {r: reach.reaching(r) for r in sorted(reach.infos)}
    details = [
        f"{nodes.short_of(r)}: {', '.join(names) or 'no interface'} reach"
        f"{'es' if len(names) <= 1 else ''} every other node"
        for r, names in per_node.items()
    ]
    facts = {
        "common": common,
        "per_node": {str(nodes.node_of(r).index): names for r, names in per_node.items()},
        "missing_ranks": list(reach.missing),
    }
    if not problems:
        if not common:
            return cluster_result(
                "cluster.ifname",
                TITLE,
                Status.WARN,
                "gloo's addresses work, but no interface name reaches every node on all of "
                "them: " + "; ".join(details),
                fix=_no_common_fix(reach, nodes),
                details=_pair_failures(reach, nodes),
                facts=facts,
            )
        name = common[0]
        set_now = _set_values(reach)
        said = f" ({set_now})" if set_now else ""
        return cluster_result(
            "cluster.ifname",
            TITLE,
            Status.PASS,
            f"{', '.join(common)} reach{'es' if len(common) == 1 else ''} every node from every "
            f"node{said}; NCCL_SOCKET_IFNAME={name} / GLOO_SOCKET_IFNAME={name} work on all "
            "hosts",
            details=details,
            facts=facts,
        )
    summary = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    if reach.any_stall():
        fix = _mtu_fix(reach)
    elif common:
        name = common[0]
        fix = (
            f"Set GLOO_SOCKET_IFNAME={name} and NCCL_SOCKET_IFNAME={name} on every node: "
            f"{name} is the interface that reaches every node from every node"
        )
        if blocker and "host name" in blocker:
            fix += (
                ", or make each node's host name resolve to its address on that interface "
                f"(in /etc/hosts or DNS: {_addresses_on(reach, name, nodes)})"
            )
        fix += "."
    else:
        fix = _no_common_fix(reach, nodes)
    return cluster_result(
        "cluster.ifname",
        TITLE,
        Status.FAIL,
        summary,
        fix=fix,
        details=[*problems[1:], *details, *_pair_failures(reach, nodes)],
        facts=facts,
    )


def _configured_problems(reach: Reach, nodes: NodeMap) -> list[str]:
    from ddpdoctor.distributed_doctor.consistency import nccl_ifname_matches

    problems: list[str] = []
    for var in IFNAME_VARS:
        for rank in sorted(reach.infos):
            value = (reach.infos[rank].get("env") or {}).get(var)
            if not value:
                continue
            have = reach.ifaces(rank)
            if var == "NCCL_SOCKET_IFNAME":
                named = nccl_ifname_matches(value, have)
            else:
                named = [n.strip() for n in value.split(",") if n.strip() in have]
            where = nodes.short_of(rank)
            if not named:
                problems.append(
                    f"{var}={value} names no interface of {where} (it has {', '.join(have)})"
                )
                continue
            for iface in named:
                misses, verb = reach.misses(rank, iface), "is not reached from"
                if not misses:
                    misses, verb = reach.stalls(rank, iface), "does not work from"
                if misses:
                    src, why = next(iter(misses.items()))
                    problems.append(
                        f"{var}={value}: {iface} of {where} {verb} {nodes.short_of(src)}: {why}"
                    )
    return problems


def _pair_failures(reach: Reach, nodes: NodeMap) -> list[str]:
    """Which pair of nodes fails on which interface (for the report's details)."""
    lines = []
    for dst in sorted(reach.infos):
        for iface in reach.ifaces(dst):
            if _loopback(iface):
                continue
            failed = {**reach.stalls(dst, iface), **reach.misses(dst, iface)}
            for src, why in failed.items():
                lines.append(f"{nodes.short_of(src)} -> {iface} of {nodes.short_of(dst)}: {why}")
    return lines


def _mtu_fix(reach: Reach) -> str:
    mtus = []
    for rank in sorted(reach.infos):
        info = reach.infos[rank]
        for iface in reach.ifaces(rank):
            mtu = (info.get("mtu") or {}).get(iface)
            if mtu and reach.stalls(rank, iface):
                mtus.append(f"{info.get('host', '?')} {iface} {mtu}")
    shown = f" ({', '.join(mtus)})" if mtus else ""
    return (
        "Connections open but large packets never arrive: an interface MTU is larger than what "
        f"the network between the nodes carries{shown}, and no 'fragmentation needed' comes "
        "back. Set every node's MTU to what the switches carry (ip link set DEV mtu 1500), or "
        "enable jumbo frames on the whole path; NCCL and gloo stall on the first large message."
    )


def _no_common_fix(reach: Reach, nodes: NodeMap) -> str:
    per_node = {r: reach.reaching(r) for r in sorted(reach.infos)}
    if all(per_node.values()):
        chosen = "; ".join(f"{nodes.short_of(r)}: {names[0]}" for r, names in per_node.items())
        return (
            "No one interface name reaches every node on all of them; set GLOO_SOCKET_IFNAME and "
            f"NCCL_SOCKET_IFNAME per node ({chosen}), or rename the interfaces alike."
        )
    stuck = [nodes.short_of(r) for r, names in per_node.items() if not names]
    return (
        f"No interface of {', '.join(stuck)} is reached by every other node. If the nodes do "
        "reach each other at MASTER_ADDR:MASTER_PORT, a firewall lets that port through but not "
        "the random high ports gloo and NCCL listen on: allow TCP between the nodes on the "
        "interface they share. Otherwise give the nodes a network they share (routes, VLANs)."
    )


def _addresses_on(reach: Reach, iface: str, nodes: NodeMap) -> str:
    parts = []
    for rank in sorted(reach.infos):
        info = reach.infos[rank]
        addr = next((a["addr"] for a in info.get("addresses") or () if a["iface"] == iface), "?")
        parts.append(f"{info.get('host', '?')} {addr}")
    return ", ".join(parts)


def _set_values(reach: Reach) -> str:
    seen = []
    for var in IFNAME_VARS:
        values = {str(v) for r in reach.infos if (v := (reach.infos[r].get("env") or {}).get(var))}
        if values:
            seen.append(f"{var}={'/'.join(sorted(values))} as set")
    return "; ".join(seen)


def reach_json(reach: Reach) -> dict[str, Any]:
    return {
        "leaders": {str(r): dict(info) for r, info in sorted(reach.infos.items())},
        "probes": [p.__dict__ for p in reach.probes],
        "missing_ranks": list(reach.missing),
    }
