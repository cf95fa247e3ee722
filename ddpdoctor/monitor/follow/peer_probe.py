"""A bounded TCP connect to a peer host: does that host answer from here?

A connect that completes, or that the peer refuses (its kernel sent a reset back), proves that
packets go both ways between the two hosts; one that times out or finds no route proves they do
not. The probes of one look run at once, each bounded by its timeout.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

PROBE_TIMEOUT_S = 2.0
MAX_PROBES = 32


@dataclass(frozen=True)
class ProbeResult:
    addr: str
    port: int
    answered: bool  # connected, or refused by the peer's kernel: the host answers
    outcome: (
        str  # "connected", "refused", "timed out", "no route to host", "network unreachable", ...
    )
    ms: float


def _outcome(exc: OSError) -> tuple[bool, str]:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return False, "timed out"
    code = exc.errno
    if code == errno.ECONNREFUSED:
        return True, "refused"
    if code == errno.EHOSTUNREACH:
        return False, "no route to host"
    if code == errno.ENETUNREACH:
        return False, "network unreachable"
    return False, (exc.strerror or type(exc).__name__).lower()


def probe(addr: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    start = time.monotonic()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect((addr, port))
        answered, outcome = True, "connected"
    except OSError as exc:
        answered, outcome = _outcome(exc)
    return ProbeResult(addr, port, answered, outcome, (time.monotonic() - start) * 1000.0)


def probe_all(
    targets: Sequence[tuple[str, int]], timeout_s: float = PROBE_TIMEOUT_S
) -> list[ProbeResult]:
    """Every target at once (at most MAX_PROBES), in the order given; within timeout_s + 1."""
    targets = list(targets)[:MAX_PROBES]
    results: list[ProbeResult | None] = [None] * len(targets)

    def one(i: int) -> None:
        results[i] = probe(*targets[i], timeout_s=timeout_s)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s + 1.0
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        r if r is not None else ProbeResult(t[0], t[1], False, "timed out", timeout_s * 1000.0)
        for r, t in zip(results, targets, strict=True)
    ]
