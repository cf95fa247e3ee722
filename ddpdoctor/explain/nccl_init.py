"""NCCL's INFO lines combined across processes: versions, network, init progress, interfaces.

Which communicators reached `Init COMPLETE` (a process that never did, while others did, is the
one they wait for), whether the NCCL versions agree, and whether NCCL's sockets include
container, bridge or link-local interfaces that other nodes cannot reach.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import MAX_EVIDENCE, Candidate, EvidenceList, to_evidence
from ddpdoctor.findings import Finding, Severity

IFNAME_FIX = (
    "Set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the routable NIC on every node "
    "(`ip -br addr`; e.g. NCCL_SOCKET_IFNAME=eth0), and allow all TCP between the nodes on it."
)

# A host name starts where a run of name characters starts (the lookbehind), so a search does not
# retry from every character of a long run: linear on any line.
_HEADER = re.compile(
    r"(?<![\w.-])(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] NCCL (?:INFO|WARN)"
)
_VERSION = re.compile(r"NCCL version (?P<version>\d[\w.+-]*)")
_RELEASE = re.compile(r"(?<!\d)(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?")
_NETWORK = re.compile(r"Using network (?P<net>\w+)")
_INIT = re.compile(r"rank (?P<rank>\d+) n[Rr]anks (?P<n>\d+).*Init (?P<what>START|COMPLETE)")
_IFACE_LIST = re.compile(r"(?P<kind>Bootstrap|NET/Socket) : Using (?P<list>\[.*)")
_IFACE = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^:\s\[]+):(?P<addr>[^<\s]+)<\d+>")
_VIA_SOCKET = re.compile(r"via NET/Socket/(?P<idx>\d+)")
_VIRTUAL_NAME = re.compile(r"^(?:veth|docker|br-|virbr|cni|flannel|tun|tap|vxlan|kube|cali|lxc)")


def nccl_release(version: str) -> tuple[int, int, int] | str:
    """(major, minor, patch) of an NCCL version as logs write it; the text when it has no numbers.

    NCCL's INFO line says `2.28.9+cuda13.0`, torch's error text `2.28.9` and packages `2.28.9-1`:
    one NCCL, so the build and package suffixes are dropped before versions are compared.
    """
    found = _RELEASE.match(version)
    if found is None:
        return version
    return (int(found["major"]), int(found["minor"]), int(found["patch"] or 0))


def is_virtual_interface(name: str, addr: str) -> bool:
    """Interfaces other nodes cannot reach: container/bridge devices and link-local addresses."""
    return bool(_VIRTUAL_NAME.match(name)) or addr.startswith(("fe80", "169.254."))


@dataclass
class _Process:
    """One NCCL process and device (host:pid [dev]) as its INFO lines describe it."""

    first: SourceLine
    rank: int | None = None
    complete: SourceLine | None = None
    interfaces: dict[str, tuple[str, str]] = field(default_factory=dict)  # idx -> (name, addr)
    socket_used: dict[str, SourceLine] = field(default_factory=dict)  # idx -> channel line


class NcclAnalyzer:
    """Init facts across every process: versions, network, who completed init, interfaces."""

    def __init__(self) -> None:
        self.processes: dict[tuple[str, str, str], _Process] = {}
        self.versions: dict[str, SourceLine] = {}  # one text per NCCL release, the first seen
        self._releases: set[tuple[int, int, int] | str] = set()
        self.networks: dict[str, SourceLine] = {}
        self.iface_lines: list[SourceLine] = []

    def feed(self, line: SourceLine) -> None:
        text = line.text
        if "NCCL" not in text:
            return
        version = _VERSION.search(text) if "NCCL version" in text else None
        if version:
            self._version(version.group("version"), line)
        header = _HEADER.search(text)
        if header is None:
            return
        key = (header.group("host"), header.group("pid"), header.group("dev"))
        proc = self.processes.get(key)
        if proc is None:
            proc = self.processes[key] = _Process(first=line, rank=line.rank)
        if "Using network" in text:
            network = _NETWORK.search(text)
            if network:
                self.networks.setdefault(network.group("net"), line)
        if "Init " in text:
            self._init_line(proc, line)
        if " : Using [" in text:
            self._interfaces(proc, line)
        if "via NET/Socket/" in text:
            for used in _VIA_SOCKET.finditer(text):
                proc.socket_used.setdefault(used.group("idx"), line)

    def _version(self, text: str, line: SourceLine) -> None:
        release = nccl_release(text)
        if release not in self._releases:
            self._releases.add(release)
            self.versions[text] = line

    def _init_line(self, proc: _Process, line: SourceLine) -> None:
        init = _INIT.search(line.text)
        if init is None:
            return
        proc.rank = int(init.group("rank"))
        if init.group("what") == "COMPLETE":
            proc.complete = line

    def _interfaces(self, proc: _Process, line: SourceLine) -> None:
        listing = _IFACE_LIST.search(line.text)
        if listing is None:
            return
        found = {
            m.group("idx"): (m.group("name"), m.group("addr")) for m in _IFACE.finditer(line.text)
        }
        # The NET/Socket list is the one channels index into; Bootstrap's is a fallback.
        if listing.group("kind") == "NET/Socket" or not proc.interfaces:
            proc.interfaces = found
        virtual = any(is_virtual_interface(*iface) for iface in found.values())
        if virtual and len(self.iface_lines) < MAX_EVIDENCE:
            self.iface_lines.append(line)

    def end_file(self, file: str | None) -> None:
        return None

    def finish(self) -> list[Candidate]:
        out = [self._init_facts(), self._incomplete(), self._versions(), self._virtual()]
        return [c for c in out if c is not None]

    def _init_facts(self) -> Candidate | None:
        done = [p for p in self.processes.values() if p.complete is not None]
        if not (self.versions or self.networks or done):
            return None
        parts = []
        if self.versions:
            parts.append("NCCL " + ", ".join(self.versions))
        if self.networks:
            parts.append("network " + ", ".join(self.networks))
        ranks = sorted({p.rank for p in done if p.rank is not None})
        if done:
            parts.append(f"init complete on {len(done)} communicator rank(s)")
        evidence = EvidenceList()
        for line in [*self.versions.values(), *self.networks.values()]:
            evidence.add(line, ())
        for proc in done:
            if proc.complete is not None:
                evidence.add(proc.complete, _ranks(proc.rank))
        finding = Finding(
            id="nccl.init",
            severity=Severity.INFO,
            summary="; ".join(parts),
            fix="Nothing to fix: facts from NCCL's INFO lines.",
            ranks=tuple(ranks),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)

    def _incomplete(self) -> Candidate | None:
        done = [p for p in self.processes.values() if p.complete is not None]
        stuck = [p for p in self.processes.values() if p.complete is None]
        if not done or not stuck:
            return None
        evidence = EvidenceList()
        names = []
        for (host, pid, dev), proc in self.processes.items():
            if proc.complete is None:
                evidence.add(proc.first, _ranks(proc.rank))
                names.append(
                    f"{host}:{pid} [{dev}]"
                    + (f" rank {proc.rank}" if proc.rank is not None else "")
                )
        finding = Finding(
            id="nccl.init_incomplete",
            severity=Severity.WARNING,
            summary=f"NCCL init never completed on {', '.join(names)} while {len(done)} "
            "other(s) completed: that process is the one the others wait for",
            fix="Look at that rank's own log (NCCL WARN lines, a Python traceback, a hang before "
            "init_process_group) and its network interface and GPU.",
            ranks=tuple(sorted(evidence.ranks)),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)

    def _versions(self) -> Candidate | None:
        if len(self.versions) < 2:
            return None
        finding = Finding(
            id="nccl.versions_differ",
            severity=Severity.ERROR,
            summary="The logs show different NCCL versions: " + ", ".join(self.versions),
            fix="Use the same NCCL on every node: the same image or pinned nvidia-nccl-cu* wheels.",
            evidence=tuple(to_evidence(line) for line in self.versions.values())[:MAX_EVIDENCE],
        )
        return Candidate(finding)

    def _virtual(self) -> Candidate | None:
        virtual: dict[str, str] = {}
        used: list[tuple[str, SourceLine]] = []
        for proc in self.processes.values():
            for idx, (name, addr) in proc.interfaces.items():
                if is_virtual_interface(name, addr):
                    virtual[name] = addr
                    if idx in proc.socket_used:
                        used.append((f"{name} (NET/Socket/{idx})", proc.socket_used[idx]))
        if not virtual:
            return None
        evidence = EvidenceList()
        for line in self.iface_lines:
            evidence.add(line, ())
        for _, line in used:
            evidence.add(line, ())
        names = ", ".join(sorted(virtual))
        if used:
            through = ", ".join(sorted({name for name, _ in used}))
            summary = (
                f"NCCL's connections go over {through}: a container, bridge or link-local "
                "interface that other nodes cannot reach"
            )
            severity = Severity.ERROR
        else:
            summary = (
                f"NCCL may use container, bridge or link-local interfaces ({names}); this only "
                "matters across nodes, where they are unreachable"
            )
            severity = Severity.WARNING
        finding = Finding(
            id="nccl.virtual_interface",
            severity=severity,
            summary=summary,
            fix=IFNAME_FIX,
            evidence=evidence.evidence(),
        )
        return Candidate(finding)


def _ranks(rank: int | None) -> tuple[int, ...]:
    return () if rank is None else (rank,)
