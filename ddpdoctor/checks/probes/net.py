"""Network facts: interfaces, name resolution, binds and connects (each bounded in time).

The methods here do one plain system call each and return frozen data. Name resolution has no
timeout of its own in the C library, so callers that must stay bounded (the checks) wrap it with
`ddpdoctor.checks.probes.bounded.bounded_call`; connects carry a socket timeout.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class NetInterface:
    name: str
    up: bool
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.ipv4 + self.ipv6


@dataclass(frozen=True)
class Resolution:
    """What getaddrinfo() said about a name: its addresses, or the resolver's error."""

    host: str
    addresses: tuple[str, ...] = ()
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.addresses) and self.error is None and not self.timed_out


@dataclass(frozen=True)
class BindAttempt:
    address: str  # "::" or "0.0.0.0", the wildcard addresses the c10d TCPStore listens on
    ok: bool
    errno: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class BindResult:
    port: int
    attempts: tuple[BindAttempt, ...]

    @property
    def free(self) -> bool:
        """The store could listen: c10d takes the first wildcard address that works."""
        return any(a.ok for a in self.attempts)

    @property
    def in_use(self) -> bool:
        return not self.free and any(a.errno == errno.EADDRINUSE for a in self.attempts)


@dataclass(frozen=True)
class PortOwner:
    """A process holding a TCP port, as far as this user may see (pid None: not permitted)."""

    pid: int | None
    address: str
    status: str
    name: str | None = None
    cmdline: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.pid is None:
            return f"a process this user cannot see ({self.status} on {self.address})"
        command = " ".join(self.cmdline) or self.name or "?"
        if len(command) > 160:
            command = command[:157] + "..."
        return f"pid {self.pid} ({command})"


@dataclass(frozen=True)
class ConnectResult:
    host: str
    port: int
    outcome: str  # "connected", "refused", "timeout", "unreachable", "unresolved" or "error"
    address: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "connected"


class RealNetProbe:
    def interfaces(self) -> list[NetInterface]:
        """Every network interface with its state and addresses (psutil; no subprocess)."""
        import psutil

        stats = psutil.net_if_stats()
        result = []
        for name, addrs in sorted(psutil.net_if_addrs().items()):
            v4 = tuple(a.address for a in addrs if a.family == socket.AF_INET)
            v6 = tuple(a.address for a in addrs if a.family == socket.AF_INET6)
            up = bool(stats[name].isup) if name in stats else False
            result.append(NetInterface(name=name, up=up, ipv4=v4, ipv6=v6))
        return result

    def hostname(self) -> str:
        return socket.gethostname()

    def resolve(self, host: str) -> Resolution:
        """getaddrinfo(host) for TCP; unbounded: callers bound it (a DNS server may never answer)."""
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as exc:
            return Resolution(host, error=_strerror(exc))
        addresses: list[str] = []
        for family, _type, _proto, _canon, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
                addresses.append(str(sockaddr[0]))
        return Resolution(host, addresses=tuple(addresses))

    def bind_test(self, port: int) -> BindResult:
        """Listen on the port on `::` and `0.0.0.0` as the c10d TCPStore server would, then close.

        SO_REUSEADDR is set, as c10d sets it, so sockets of a finished run in TIME_WAIT do not
        count as a port in use; a live listener still does.
        """
        attempts = []
        for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:  # no IPv6 in this kernel or container
                attempts.append(BindAttempt(address, False, exc.errno, _strerror(exc)))
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.listen(1)
                attempts.append(BindAttempt(address, True))
            except OSError as exc:
                attempts.append(BindAttempt(address, False, exc.errno, _strerror(exc)))
            finally:
                sock.close()
        return BindResult(port, tuple(attempts))

    def port_owners(self, port: int) -> list[PortOwner]:
        """The processes listening on (or else bound to) a TCP port, with their command lines."""
        import psutil

        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return []
        matching = [c for c in conns if c.laddr and c.laddr.port == port]
        listening = [c for c in matching if c.status == psutil.CONN_LISTEN]
        owners: list[PortOwner] = []
        seen: set[tuple[int | None, str]] = set()
        for conn in listening or matching:
            address = f"{conn.laddr.ip}:{conn.laddr.port}"
            if (conn.pid, address) in seen:
                continue
            seen.add((conn.pid, address))
            name, cmdline = None, ()
            if conn.pid is not None:
                try:
                    proc = psutil.Process(conn.pid)
                    name, cmdline = proc.name(), tuple(proc.cmdline())
                except (psutil.Error, OSError):
                    pass
            owners.append(PortOwner(conn.pid, address, str(conn.status), name, cmdline))
        return owners

    def connect(self, host: str, port: int, timeout_s: float = 2.0) -> ConnectResult:
        """A TCP connect to host:port, trying each resolved address until one answers."""
        resolution = self.resolve(host)
        if not resolution.ok:
            return ConnectResult(host, port, "unresolved", error=resolution.error)
        last = ConnectResult(host, port, "error", error="no address to try")
        for address in resolution.addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                with socket.socket(family, socket.SOCK_STREAM) as sock:
                    sock.settimeout(timeout_s)
                    sock.connect((address, port))
                return ConnectResult(host, port, "connected", address=address)
            except TimeoutError:
                last = ConnectResult(
                    host, port, "timeout", address, f"no answer in {timeout_s:g} s"
                )
            except OSError as exc:
                last = ConnectResult(host, port, _connect_outcome(exc), address, _strerror(exc))
        return last

    def ancestor_pids(self) -> frozenset[int]:
        """This process and those that started it: a launcher (torchrun) that runs the doctor
        holds the store's port itself, which is no conflict."""
        import psutil

        pids = {os.getpid()}
        try:
            pids.update(p.pid for p in psutil.Process().parents())
        except (psutil.Error, OSError):
            pass
        return frozenset(pids)

    def free_port(self) -> int:
        """A port nobody listens on now (the kernel's choice), to suggest in a fix."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])


def _connect_outcome(exc: OSError) -> str:
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return "unreachable"
    if exc.errno == errno.ETIMEDOUT:
        return "timeout"
    return "error"


def _strerror(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
