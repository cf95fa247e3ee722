"""c10d: the TCPStore, its sockets and the env:// / c10d rendezvous."""

from __future__ import annotations

import re

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import MAX_EVIDENCE, Candidate, EvidenceList, Groups, rule
from ddpdoctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_REACH_FIX = (
    "Check that MASTER_ADDR / MASTER_PORT (or --rdzv-endpoint) name the host that runs rank 0 "
    "and resolve to the same address on every node, that rank 0 started and is listening (it may "
    "have crashed first), and that no firewall blocks the port; keep /etc/hosts consistent."
)


def _port_summary(groups: Groups) -> str:
    port = groups.get("port") or groups.get("port2") or groups.get("port3")
    return (
        f"The rendezvous port {port} is already in use" if port else "The rendezvous port is in use"
    ) + ": another job, or a leftover process of an earlier run, is listening on it"


def _store_summary(groups: Groups) -> str:
    joined, total = int(groups.get("joined", 0)), int(groups.get("total", 0))
    return (
        f"Only {joined} of {total} ranks (nodes, under torchrun's static rendezvous) reached the "
        f"rendezvous store within {groups.get('secs')} s: {total - joined} never started or "
        "cannot reach it"
    )


RULES = (
    rule(
        "c10d.port_in_use",
        ERROR,
        r"(?:listen on|bind to) \[?[^\s\]]*\]?:(?P<port>\d+) \(errno: 98|"
        r"port: (?P<port2>\d+), useIpv6: \w+, code: -98|"
        r"failed to listen on any local network address(?:\. port: (?P<port3>\d+))?|"
        r"Address already in use",
        ["errno: 98", "code: -98", "failed to listen on any local", "Address already in use"],
        _port_summary,
        "Pick a free port per job (--master-port, or --rdzv-endpoint=host:0 / --standalone), and "
        "kill leftover processes of earlier runs (`ss -ltnp | grep PORT` shows the owner).",
        examples=(
            "[W socket.cpp:401] [c10d] The server socket has failed to listen on [::]:47531 "
            "(errno: 98 - Address already in use).",
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29077, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use",
        ),
    ),
    rule(
        "c10d.connect_timeout",
        ERROR,
        r"The client socket has timed out after (?P<after>\w+) while trying to connect to "
        r"\((?P<host>[^,]+), (?P<port>\d+)\)",
        ["client socket has timed out"],
        "This rank could not reach the rendezvous store at {host}:{port} (timed out after {after})",
        _REACH_FIX,
        examples=(
            "[E108 20:04:34.467642512 socket.cpp:957] [c10d] The client socket has timed out "
            "after 900s while trying to connect to (33.145.124.128, 29500).",
        ),
    ),
    rule(
        "c10d.connect_timeout",
        ERROR,
        r"TCP client failed to connect/validate to host (?P<host>\S+?):(?P<port>\d+) - "
        r"|The connection to the C10d store has failed",
        ["TCP client failed to connect", "connection to the C10d store has failed"],
        "This rank could not reach the rendezvous store at {host}:{port}",
        _REACH_FIX,
        level="warn",
        examples=(
            "[W1122 04:13:20.109683450 TCPStore.cpp:340] [c10d] TCP client failed to "
            "connect/validate to host 127.0.0.1:29136 - retrying (try=0, timeout=3000ms, "
            "delay=1374ms): The client socket has timed out after 3000ms",
        ),
    ),
    rule(
        "c10d.store_timeout",
        ERROR,
        r"Timed out after (?P<secs>\d+) seconds waiting for clients\. (?P<joined>\d+)/"
        r"(?P<total>\d+) clients joined",
        ["waiting for clients"],
        _store_summary,
        "Compare WORLD_SIZE (nnodes x nproc_per_node) with the processes really launched, check "
        "that every node started, and that each can reach MASTER_ADDR:MASTER_PORT.",
        examples=(
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
            "1/3 clients joined.",
        ),
    ),
    rule(
        "c10d.rendezvous_timeout",
        ERROR,
        r"(?:^|\.)RendezvousTimeoutError\b",  # the exception line, not `raise ...` above it
        ["RendezvousTimeoutError"],
        "torchrun's rendezvous timed out: not every node joined within its join timeout "
        "(600 s by default), so no rank started",
        "Start torchrun (or `ddpdoctor run --node-rank N`) on every node with the same --nnodes, "
        "--rdzv-endpoint and --rdzv-id, and check that each node reaches the endpoint (address, "
        "port, firewall). Bound the wait with --rdzv-conf join_timeout=SECONDS (torchrun) or "
        "--join-timeout (ddpdoctor run).",
        examples=("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",),
    ),
    rule(
        "c10d.store_wait_timeout",
        ERROR,
        r"wait timeout after (?P<ms>\d+)ms, keys: (?P<keys>\S+)",
        ["wait timeout after"],
        "This rank waited {ms} ms for store keys ({keys}) that another rank should have written: "
        "that rank never got there (it failed, is behind, or the world size is wrong)",
        "Look at the other ranks' logs for the first failure; check WORLD_SIZE against the ranks "
        "actually started.",
        examples=(
            "torch.distributed.DistStoreError: wait timeout after 3000ms, keys: "
            "/default_pg/0//cpu//0/0",
        ),
    ),
    rule(
        "c10d.env_missing",
        ERROR,
        r"environment variable (?P<var>\w+) expected, but not set|"
        r"KeyError: '(?P<var2>RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'",
        ["expected, but not set", "KeyError: '"],
        lambda g: (
            f"env:// rendezvous: {g.get('var') or g.get('var2')} is not set: the script was "
            "not started by torchrun or another launcher"
        ),
        "Launch with `torchrun --nproc-per-node N train.py`, or export RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT (with mp.spawn, set MASTER_ADDR and MASTER_PORT in code).",
        examples=(
            "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
            "variable MASTER_ADDR expected, but not set",
        ),
    ),
    rule(
        "c10d.host_unknown",
        ERROR,
        r"gaierror: \[Errno -?\d+\] (?:Name or service not known|Temporary failure in name "
        r"resolution|No address associated with hostname|nodename nor servname provided)",
        ["gaierror"],
        "A host name could not be resolved: the rendezvous endpoint (--rdzv-endpoint, "
        "--master-addr, MASTER_ADDR) names a host this machine's resolver does not know",
        "Give the rendezvous host as an address every node can reach, or a name each node "
        "resolves (`getent hosts NAME` on every node; /etc/hosts or DNS); under Slurm, "
        "`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1` gives node 0's name.",
        examples=(
            "socket.gaierror: [Errno -2] Name or service not known",
            "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        ),
    ),
    rule(
        "c10d.connect_failed",
        ERROR,
        r"failed to connect to any network address of|The client socket has failed to connect to",
        ["failed to connect to any network address", "client socket has failed to connect"],
        emits=False,
        examples=(
            "[E socket.cpp:753] [c10d] The client socket has failed to connect to any network "
            "address of (6841231, 47389).",
        ),
    ),
)

_ATTEMPT = re.compile(r"The client socket has failed to connect to (?!any network address)")
_GAVE_UP = re.compile(
    r"failed to connect to any network address of \((?P<host>[^,]+), (?P<port>\d+)\)"
)


def dotted_quad(number: int) -> str:
    """How a resolver reads an all-digit host name: as one 32-bit IPv4 number."""
    return ".".join(str((number >> shift) & 0xFF) for shift in (24, 16, 8, 0))


class C10dConnectAnalyzer:
    """Per-address connect attempts, then the final give-up line (with its host name)."""

    def __init__(self) -> None:
        self.attempts = EvidenceList()
        self.gave_up: list[tuple[SourceLine, str, str]] = []

    def feed(self, line: SourceLine) -> None:
        if "failed to connect to" not in line.text:
            return
        final = _GAVE_UP.search(line.text)
        if final:
            if len(self.gave_up) < MAX_EVIDENCE:  # a client retrying for hours repeats itself
                self.gave_up.append((line, final.group("host").strip(), final.group("port")))
        elif _ATTEMPT.search(line.text):
            self.attempts.add(line)

    def end_file(self, file: str | None) -> None:
        return None

    def finish(self) -> list[Candidate]:
        if not self.gave_up and not self.attempts.lines:
            return []
        evidence = EvidenceList(list(self.attempts.lines), set(self.attempts.ranks))
        for line, _, _ in self.gave_up:
            evidence.add(line)
        numeric = [(host, port) for _, host, port in self.gave_up if host.isdigit()]
        if numeric:
            host, port = numeric[0]
            finding = Finding(
                id="c10d.numeric_hostname",
                severity=Severity.ERROR,
                summary=f"The master host name {host!r} is all digits, so it was read as the IPv4 "
                f"address {dotted_quad(int(host))}; the store at port {port} was never reached",
                fix="Use the master's IP address or a fully qualified name for MASTER_ADDR / "
                "--rdzv-endpoint (or rename the host so it contains a letter).",
                ranks=tuple(sorted(evidence.ranks)),
                evidence=evidence.evidence(),
            )
        elif self.gave_up:
            _, host, port = self.gave_up[0]
            finding = Finding(
                id="c10d.connect_failed",
                severity=Severity.ERROR,
                summary=f"This rank could not connect to the rendezvous store at {host}:{port}",
                fix=_REACH_FIX,
                ranks=tuple(sorted(evidence.ranks)),
                evidence=evidence.evidence(),
            )
        else:
            finding = Finding(
                id="c10d.connect_failed",
                severity=Severity.WARNING,
                summary="This rank is retrying its connection to the rendezvous store",
                fix=_REACH_FIX,
                ranks=tuple(sorted(evidence.ranks)),
                evidence=evidence.evidence(),
            )
        return [Candidate(finding)]
