"""A DNS server of the test's own on a loopback address, and processes that use only it.

Tests of name resolution (a name that appears late, a server that never answers) must never
send a query to a real server. `DnsStub` answers UDP queries on 127.x.y.z:53 from a table the
test controls; `private_resolver` is the command prefix that runs a process in a mount namespace
of its own whose /etc/resolv.conf names only the stub and whose /etc/hosts is the test's, so the
process, its children and their C library resolve through the stub alone.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# What the stub does with a query for a name: an IPv4 address to answer, "nxdomain", or "drop"
# (never answer: a DNS server that is down or firewalled).
Answer = str
QTYPE_A = 1


@dataclass
class DnsStub:
    address: str
    rules: dict[str, Callable[[], Answer]]
    queries: list[tuple[float, str, int]]

    def answer_for(self, name: str) -> Answer:
        rule = self.rules.get(name.lower().rstrip("."))
        return rule() if rule is not None else "nxdomain"


def appears_at(when: float, address: str) -> Callable[[], Answer]:
    """NXDOMAIN until time.monotonic() reaches `when`, then `address` (a headless service's
    name, published once its pod is ready)."""
    return lambda: address if time.monotonic() >= when else "nxdomain"


def never_answers() -> Answer:
    return "drop"


@contextlib.contextmanager
def dns_stub(rules: dict[str, Callable[[], Answer]]) -> Iterator[DnsStub]:
    """A DNS server on a random 127.x.y.1, port 53, until the block ends (needs root)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(20):
        address = f"127.{random.randrange(1, 250)}.{random.randrange(1, 250)}.1"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        sock.close()
        raise RuntimeError("no free loopback address for the DNS stub")
    stub = DnsStub(address, {k.lower(): v for k, v in rules.items()}, [])
    stop = threading.Event()
    sock.settimeout(0.1)

    def serve() -> None:
        while not stop.is_set():
            try:
                packet, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = _reply(stub, packet)
            if reply is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, name="dns-stub", daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stop.set()
        thread.join(2)
        sock.close()


def routable_address() -> str | None:
    """An IPv4 address of this machine other than loopback: what a pod's name resolves to."""
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith(("127.", "169.254.")):
                return str(a.address)
    return None


def private_resolver(stub: DnsStub, workdir: Path, host_address: str) -> list[str]:
    """The command prefix that runs a command with /etc/resolv.conf naming only `stub` and an
    /etc/hosts where this machine's name is `host_address`, in a mount namespace of its own."""
    resolv = workdir / "resolv.conf"
    resolv.write_text(f"nameserver {stub.address}\n")
    hosts_file = workdir / "hosts"
    name = socket.gethostname()
    hosts_file.write_text(f"127.0.0.1 localhost\n::1 localhost\n{host_address} {name}\n")
    script = (
        'mount --bind "$0" /etc/resolv.conf && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    )
    return ["unshare", "--mount", "--", "sh", "-c", script, str(resolv), str(hosts_file)]


def _reply(stub: DnsStub, packet: bytes) -> bytes | None:
    if len(packet) < 12:
        return None
    ident, _flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        return None
    labels, offset = [], 12
    while offset < len(packet) and packet[offset] != 0:
        length = packet[offset]
        labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    question_end = offset + 5
    if question_end > len(packet):
        return None
    qtype = struct.unpack("!H", packet[offset + 1 : offset + 3])[0]
    name = ".".join(labels)
    stub.queries.append((time.monotonic(), name, qtype))
    answer = stub.answer_for(name)
    if answer == "drop":
        return None
    question = packet[12:question_end]
    if answer == "nxdomain":
        return struct.pack("!HHHHHH", ident, 0x8183, 1, 0, 0, 0) + question
    if qtype != QTYPE_A:  # the name exists, with no record of this type (NODATA)
        return struct.pack("!HHHHHH", ident, 0x8180, 1, 0, 0, 0) + question
    record = struct.pack("!HHHIH", 0xC00C, QTYPE_A, 1, 0, 4) + socket.inet_aton(answer)
    return struct.pack("!HHHHHH", ident, 0x8180, 1, 1, 0, 0) + question + record
