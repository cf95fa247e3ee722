"""gloo's errors: full-mesh connects, interface names, size mismatches, timeouts, dead peers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import MAX_EVIDENCE, Candidate, EvidenceList, Groups, rule
from ddpdoctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_LOOPBACK_FIX = (
    "Set GLOO_SOCKET_IFNAME to the routable NIC on every node (e.g. GLOO_SOCKET_IFNAME=eth0), "
    "or map the hostname to its routable IP in /etc/hosts instead of 127.0.1.1 / 127.0.0.1."
)


def _ifname_summary(groups: Groups) -> str:
    name = groups.get("name", "?")
    if name.startswith(("^", "=")) or "," in name:
        return (
            f"GLOO_SOCKET_IFNAME={name} uses NCCL's list or exclusion syntax; gloo takes only "
            "concrete interface names"
        )
    return f"gloo found no interface named {name!r} with an address (GLOO_SOCKET_IFNAME)"


def _peer_summary(groups: Groups) -> str:
    addr = groups.get("addr") or groups.get("addr2")
    where = f" at {addr}" if addr else ""
    return (
        f"A gloo peer{where} closed or reset the connection: that peer crashed or was killed, "
        "and this rank failed as a consequence"
    )


RULES = (
    rule(
        "gloo.size_mismatch",
        ERROR,
        r"Received data size doesn't match expected size|op\.preamble\.length <= op\.nbytes\. "
        r"(?P<got>\d+) vs (?P<expected>\d+)|gloo::EnforceNotMet",
        ["doesn't match expected size", "op.preamble.length", "gloo::EnforceNotMet"],
        lambda g: (
            "A rank received a message of a different size than its collective expected"
            + (f" ({g['got']} vs {g['expected']} bytes)" if g.get("got") else "")
            + ": the ranks ran different collectives, or the same one with different tensor sizes"
        ),
        "Make every rank call the same collectives in the same order with the same shapes (pad "
        "data-dependent sizes); the per-rank collective sequence or TORCH_DISTRIBUTED_DEBUG=DETAIL "
        "shows where they diverge.",
        examples=(
            "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:464] "
            "op.preamble.length <= op.nbytes. 20 vs 12. Received data size doesn't match expected "
            "size. Is there a distributed collective mismatch in your code?",
        ),
    ),
    rule(
        "gloo.peer_closed",
        ERROR,
        r"Connection closed by peer \[?(?P<addr>[\w.:]+?)\]?:\d+|"
        r"Read error \[?(?P<addr2>[\w.:]+?)\]?:\d+: Connection reset by peer|"
        r"Connection reset by peer",
        ["Connection closed by peer", "Connection reset by peer"],
        _peer_summary,
        "Fix the peer that died first (its traceback, or torchrun's Root Cause); this rank's "
        "error is a consequence. Across nodes, a 127.x peer address means the hostname resolves "
        "to loopback: " + _LOOPBACK_FIX,
        consequence=True,
        examples=(
            "[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
            "Connection closed by peer [127.0.0.1]:8627. This is typically caused by a remote "
            "worker crashing.",
        ),
    ),
    rule(
        "gloo.ifname_invalid",
        ERROR,
        r"Unable to find address for: (?P<name>\S+)",
        ["Unable to find address for"],
        _ifname_summary,
        "Give GLOO_SOCKET_IFNAME existing interface names only (`ip -br addr`), e.g. "
        "GLOO_SOCKET_IFNAME=eth0 — no ^, = or IP addresses.",
        examples=("  ifa != nullptr. Unable to find address for: ^lo",),
    ),
    rule(
        "gloo.timeout",
        ERROR,
        r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation to complete",
        ["Timed out waiting"],
        "A gloo {op} waited {ms} ms: a peer never joined this collective (it is behind, stuck, "
        "or in a different collective)",
        "Find the rank that did not reach this collective (py-spy dump of every rank, or the "
        "per-rank collective sequence): a rank-dependent branch, a slow rank-0-only step, or "
        "uneven data. Raise init_process_group(timeout=...) only for a legitimately long phase.",
        examples=(
            "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 4000ms for recv operation to complete",
        ),
    ),
    rule(
        "gloo.monitored_barrier",
        ERROR,
        r"Rank (?P<rank>\d+) failed to pass monitoredBarrier in (?P<ms>\d+) ms",
        ["failed to pass monitoredBarrier"],
        "Rank {rank} did not reach the monitored barrier within {ms} ms: it is behind or stuck",
        "Find out what rank {rank} was doing at that point (py-spy dump, its last log lines): a "
        "collective it skipped, a slow step only it runs, or a hang.",
        rank_groups=("rank",),
        examples=(
            "[rank0]:[E1122 04:12:08.388551894 ProcessGroupGloo.cpp:68] [Rank 0]: Rank 1 failed "
            "to pass monitoredBarrier in 3000 ms",
        ),
    ),
    rule(
        "gloo.connect_failed",
        ERROR,
        r"connectFullMesh failed",
        ["connectFullMesh failed"],
        emits=False,
        examples=(
            "RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/"
            "transport/tcp/pair.cc:152]",
        ),
    ),
)

_MESH_DETAIL = re.compile(
    r"remote=\[(?P<remote>[^\]]+)\]|local=\[(?P<local>[^\]]+)\]|rank=(?P<rank>\d+)"
)
_WRAPPED_LINES = 3  # gloo messages are sometimes quoted wrapped over a few indented lines


@dataclass
class _MeshError:
    lines: list[SourceLine] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(line.body.strip() for line in self.lines)


class GlooAnalyzer:
    """`Gloo connectFullMesh failed ...`, with its remote/local addresses on wrapped lines."""

    def __init__(self, *, one_host: bool = False) -> None:
        self.errors: list[_MeshError] = []
        self._open: dict[str | None, _MeshError] = {}
        # On one machine every rank is reached over loopback by design: a failed full-mesh
        # connect there is a peer that died or stalled while the group formed, not a host name
        # other nodes cannot reach.
        self.one_host = one_host

    def feed(self, line: SourceLine) -> None:
        current = self._open.get(line.file)
        if current is not None:
            stripped = line.body[:1]
            if len(current.lines) <= _WRAPPED_LINES and stripped in (" ", "\t", "("):
                current.lines.append(line)
                return
            del self._open[line.file]
        if "connectFullMesh failed" in line.text and len(self.errors) < MAX_EVIDENCE:
            error = _MeshError([line])
            self.errors.append(error)
            self._open[line.file] = error

    def end_file(self, file: str | None) -> None:
        self._open.pop(file, None)

    def finish(self) -> list[Candidate]:
        loopback, other = EvidenceList(), EvidenceList()
        addresses: set[str] = set()
        for error in self.errors:
            details = list(_MESH_DETAIL.finditer(error.text))
            ranks = [int(m.group("rank")) for m in details if m.group("rank")]
            hosts = [m.group("remote") or m.group("local") for m in details if not m.group("rank")]
            target = loopback if any(h.startswith("127.") for h in hosts) else other
            addresses.update(h for h in hosts if h)
            for line in error.lines:
                target.add(line, ranks or None)
        out = []
        if self.one_host and (loopback.lines or other.lines):
            return [_one_host_failure(loopback, other)]
        if loopback.lines:
            finding = Finding(
                id="gloo.loopback",
                severity=Severity.ERROR,
                summary="gloo connected its ranks over a loopback address (127.x): the hostname "
                "resolves to loopback, so ranks on other nodes cannot reach it",
                fix=_LOOPBACK_FIX,
                ranks=tuple(sorted(loopback.ranks)),
                evidence=loopback.evidence(),
            )
            out.append(Candidate(finding))
        if other.lines:
            listed = ", ".join(sorted(a for a in addresses if not a.startswith("127.")))
            finding = Finding(
                id="gloo.connect_failed",
                severity=Severity.ERROR,
                summary="gloo could not connect its ranks to each other"
                + (f" (addresses {listed})" if listed else ""),
                fix="Allow TCP between all nodes on the interface gloo uses (a firewall usually "
                "blocks the ephemeral ports); set GLOO_SOCKET_IFNAME to the routable NIC.",
                ranks=tuple(sorted(other.ranks)),
                evidence=other.evidence(),
            )
            out.append(Candidate(finding))
        return out


def _one_host_failure(loopback: EvidenceList, other: EvidenceList) -> Candidate:
    """gloo's full mesh failed in a job on one machine: a consequence of a peer that died or
    stalled while the group formed (other findings name it), not an address other nodes
    cannot reach."""
    evidence = EvidenceList()
    for found in (loopback, other):
        for line in found.lines:
            evidence.add(line, ())
        evidence.ranks.update(found.ranks)
    how = " (over loopback, the right address for a job on one node)" if loopback.lines else ""
    finding = Finding(
        id="gloo.connect_failed",
        severity=ERROR,
        summary=f"gloo could not connect its ranks on this machine{how}: a peer rank died or "
        "stalled while the process group formed",
        fix="Look at the rank that failed or stopped first (its log and exit status): the ranks "
        "that report this error only waited for it.",
        ranks=tuple(sorted(evidence.ranks)),
        evidence=evidence.evidence(),
    )
    return Candidate(finding, consequence=True)
