"""Which of a node's addresses the other nodes can reach, found before gloo tries.

gloo and NCCL each listen on ONE address per rank (the interface named by GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME, else what the host name resolves to, else loopback) and every peer must
connect to it. An interface that exists but reaches no peer, a host name that resolves to
127.0.1.1, or a firewall that lets only MASTER_PORT through all look the same from inside gloo:
a connect that waits out its own timeout. Here one rank per node listens on every address,
tells the others its addresses through the store, and connects to each peer's addresses with a
short timeout; the listener answers with a token, so reaching some other host's listener (the
same loopback or docker address on every host) does not count.

Pure helpers (addresses, gloo's choice, the probe) and the store exchange live here; judging the
results is `reach_verdict.py`.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from ddpdoctor.checks.probes.bounded import bounded_call

CONNECT_TIMEOUT_S = 2.0  # a peer on the same network answers a connect in milliseconds
MAX_PROBES_IN_FLIGHT = 32
TOKEN_BYTES = 96
# After its token a listener sends this much: a path that passes a connect but loses large
# packets (an MTU larger than the network carries, no ICMP back) stalls here, as gloo would.
BULK_BYTES = 64 * 1024
BULK_CHUNK = 4096


@dataclass(frozen=True)
class Address:
    iface: str
    addr: str


@dataclass(frozen=True)
class GlooChoice:
    """The address gloo will listen on and advertise on this rank, and why."""

    addr: str | None
    iface: str | None  # the interface holding addr, when one does
    source: str  # "GLOO_SOCKET_IFNAME=eth1", "host name h2", "loopback fallback"
    error: str | None = None  # why gloo cannot start at all (a named interface is missing)


@dataclass(frozen=True)
class Probe:
    """One connect from a node's leader to an address of another node's leader."""

    src: int  # the rank that connected
    dst: int  # the rank whose listener was the target
    iface: str  # dst's interface holding addr ("" for an address on no interface)
    addr: str
    ok: bool
    ms: float | None = None
    error: str | None = None
    bulk: bool | None = None  # the BULK_BYTES after the token arrived (None: not reached)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Probe:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def local_addresses(interfaces: Callable[[], list[Any]] | None = None) -> list[Address]:
    """Every IPv4 address of an interface that is up (IPv6 link-local addresses need a scope
    and gloo does not advertise them; IPv4 is what the launchers' MASTER_ADDR uses)."""
    if interfaces is None:
        from ddpdoctor.checks.probes.net import RealNetProbe

        interfaces = RealNetProbe().interfaces
    try:
        found = interfaces()
    except Exception:  # noqa: BLE001 - psutil missing or broken: nothing to offer
        return []
    return [Address(i.name, a) for i in found if i.up for a in i.ipv4]


def gloo_choice(
    env: Mapping[str, str], addresses: Sequence[Address], hostname: str | None = None
) -> GlooChoice:
    """What torch's gloo device will use here (ProcessGroupGloo's createDefaultDevice): the
    first GLOO_SOCKET_IFNAME interface's address; else the first address the host name resolves
    to that can be bound; else loopback, with a warning nobody reads."""
    named = (env.get("GLOO_SOCKET_IFNAME") or "").strip()
    if named:
        first = named.split(",")[0].strip()
        mine = [a for a in addresses if a.iface == first]
        source = f"GLOO_SOCKET_IFNAME={named}"
        if not mine:
            return GlooChoice(None, first, source, error=f"no interface {first} with an address")
        return GlooChoice(mine[0].addr, first, source)
    host = hostname or socket.gethostname()
    resolved = bounded_call(lambda: _bindable(host), 3.0, name="gloo-resolve")
    by_addr = {a.addr: a.iface for a in addresses}
    if resolved.ok and resolved.value:
        addr = resolved.value
        return GlooChoice(addr, by_addr.get(addr) or _loopback_iface(addr), f"host name {host}")
    if resolved.timed_out:
        why = "did not resolve in time"
    elif resolved.ok:
        why = "resolves to no address of this host"
    else:
        why = "does not resolve"
    return GlooChoice("127.0.0.1", "lo", f"loopback fallback: host name {host} {why}")


def _bindable(host: str) -> str | None:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            try:
                sock.bind((sockaddr[0], 0))
            except OSError:
                continue
            return str(sockaddr[0])
    return None


def _loopback_iface(addr: str) -> str | None:
    return "lo" if addr.startswith("127.") or addr == "::1" else None


class Listener:
    """Accepts on every address (0.0.0.0) and answers each connection with this rank's token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ddpdoctor-reach", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(CONNECT_TIMEOUT_S + 1)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.sendall(self._token)
                # In messages of a few KiB, as gloo sends them: each leaves as one packet larger
                # than a 1500-byte MTU, where one large buffer may leave as a segmented burst.
                for _ in range(BULK_BYTES // BULK_CHUNK):
                    conn.sendall(bytes(BULK_CHUNK))
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self._sock.close()


def token(run_id: str, rank: int) -> str:
    return f"ddpdoctor-reach {run_id} {rank}\n"[:TOKEN_BYTES]


def connect_once(addr: str, port: int, expected: str, timeout_s: float) -> Probe:
    """One probe (src and dst left 0): ok when addr:port answered with `expected`; bulk when
    the BULK_BYTES behind it arrived too, within the same timeout."""
    want = expected.encode()
    start = time.perf_counter()
    got = b""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s) as sock:
            ms = (time.perf_counter() - start) * 1e3
            sock.settimeout(max(0.2, timeout_s - ms / 1e3))
            try:
                while len(got) < len(want) + BULK_BYTES:
                    chunk = sock.recv(BULK_BYTES)
                    if not chunk:
                        break
                    got += chunk
            except TimeoutError:
                pass  # judged below: no token at all, or a token and a stalled bulk
    except TimeoutError:
        return Probe(0, 0, "", addr, False, error=f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return Probe(0, 0, "", addr, False, error=_why(exc))
    if len(got) < len(want):
        return Probe(0, 0, "", addr, False, error=f"no answer within {timeout_s:g} s")
    if got[: len(want)] != want:
        return Probe(
            0, 0, "", addr, False, error="reached another host (it answers for someone else)"
        )
    bulk = len(got) >= len(want) + BULK_BYTES
    return Probe(0, 0, "", addr, True, ms, None, bulk)


def _why(exc: OSError) -> str:
    names = {
        errno.ECONNREFUSED: "refused",
        errno.EHOSTUNREACH: "no route to host",
        errno.ENETUNREACH: "network unreachable",
        errno.ECONNRESET: "reset",
    }
    return names.get(exc.errno or 0) or exc.strerror or type(exc).__name__


def probe_peers(
    me: int,
    peers: Mapping[int, Mapping[str, Any]],
    run_id: str,
    deadline: float,
) -> list[Probe]:
    """Connect to every address of every peer, in parallel, each within CONNECT_TIMEOUT_S."""
    targets = [
        (rank, a["iface"], a["addr"], int(info["port"]))
        for rank, info in sorted(peers.items())
        if rank != me
        for a in _targets(info)
    ]
    timeout = max(0.2, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))

    def one(target: tuple[int, str, str, int]) -> Probe:
        rank, iface, addr, port = target
        return replace(
            connect_once(addr, port, token(run_id, rank), timeout), src=me, dst=rank, iface=iface
        )

    if not targets:
        return []
    with ThreadPoolExecutor(min(MAX_PROBES_IN_FLIGHT, len(targets))) as pool:
        return list(pool.map(one, targets))


def _targets(info: Mapping[str, Any]) -> list[dict[str, str]]:
    """A peer's interface addresses plus its gloo address when that is on no interface."""
    addresses = [dict(a) for a in info.get("addresses") or ()]
    gloo = (info.get("gloo") or {}).get("addr")
    if gloo and gloo not in {a["addr"] for a in addresses}:
        addresses.append({"iface": (info.get("gloo") or {}).get("iface") or "", "addr": gloo})
    return addresses


# -- the exchange through the store ---------------------------------------------------------


def publish_self(store: Any, rank: int, info: Mapping[str, Any]) -> None:
    store.set(f"reach/addr/{rank}", json.dumps(info))


def describe_self(port: int, addresses: Sequence[Address], gloo: GlooChoice) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "port": port,
        "addresses": [asdict(a) for a in addresses],
        "mtu": interface_mtus(),
        "gloo": asdict(gloo),
    }


def interface_mtus() -> dict[str, int]:
    try:
        import psutil

        return {name: int(st.mtu) for name, st in psutil.net_if_stats().items()}
    except Exception:  # noqa: BLE001 - psutil missing or broken: no MTU facts
        return {}


def read_keys(store: Any, keys: Sequence[str], deadline: float) -> dict[str, Any]:
    """The JSON values of `keys` that appear before the deadline (polling; never blocking)."""
    found: dict[str, Any] = {}
    while True:
        for key in keys:
            if key not in found and store.check([key]):
                try:
                    found[key] = json.loads(store.get(key))
                except (ValueError, RuntimeError):
                    found[key] = None
        if len(found) == len(keys) or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)
