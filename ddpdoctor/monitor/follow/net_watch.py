"""A node's look at its own ranks' network, taken only once they all stopped progressing.

When every rank of this node has made no progress past the hang threshold (each blocked in a
collective, or stalled), the launcher reads what their TCP connections say (tcp_diag: queued
bytes, retransmits, time since the last ACK, segments in and out) and probes each peer host they
talk to (peer_probe), in a background thread, and writes the look to
RUN_DIR/nodes/node-<N>/network.json; again every LOOK_EVERY_S while the stall lasts, and the file
is removed once the ranks progress again. Node 0 reads every node's file (`read_reports`), and
the judge's network rule joins them. A job that progresses never has a look taken: the per-poll
cost is a pass over this node's rank views.

The names the job relies on (the rendezvous endpoint's or MASTER_ADDR's host, this host's own
name) are looked up when the launcher starts and again with each look, and every NAMES_EVERY_S in
the background: a name whose answer changed is written to the same file even while the job runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from ddpdoctor.monitor.follow import peer_probe, tcp_diag
from ddpdoctor.monitor.model.network import (
    MAX_LINKS,
    MAX_NAMES,
    LinkView,
    NameView,
    NodeNetwork,
    ProbeView,
    node_network_from_json,
)
from ddpdoctor.monitor.model.state import RankState
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic

NETWORK_NAME = "network.json"
LOOK_EVERY_S = 3.0
NAMES_EVERY_S = 15.0
MAX_REPORT_BYTES = 1 << 20
MAX_PEERS = 16  # peer hosts probed per look
SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40
_STALLED = frozenset({RankState.STALLED, RankState.WAITING})


def network_path(run: RunDir, node_rank: int) -> Path:
    return run.node_dir(node_rank) / NETWORK_NAME


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback or addr in ("0.0.0.0", "::")
    except ValueError:
        return True


def interface_state(iface: str) -> str:
    """ "up", "down" (set down), or "no carrier" (up, but its link is lost: a cable, the peer's
    end of a veth, a switch port), from the interface's flags (SIOCGIFFLAGS)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            req = struct.pack("16sH", iface.encode()[:15], 0)
            flags = struct.unpack("16sH", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
    except OSError:
        return "unknown"
    if not flags & IFF_UP:
        return "down"
    return "up" if flags & IFF_RUNNING else "no carrier"


def local_addresses() -> tuple[tuple[str, str, str], ...]:
    """(address, interface, its state) of this host's IP addresses."""
    try:
        addrs = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return ()
    out = []
    for iface, entries in sorted(addrs.items()):
        state = interface_state(iface)
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                out.append((entry.address.split("%")[0], iface, state))
    return tuple(out[:64])


def resolve(name: str) -> tuple[tuple[str, ...], str | None, float]:
    """(addresses, error, seconds the lookup took)."""
    start = time.monotonic()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return (), str(getattr(exc, "strerror", None) or exc), time.monotonic() - start
    seen: dict[str, None] = {}
    for info in infos:
        seen[str(info[4][0])] = None
    return tuple(seen), None, time.monotonic() - start


def job_names(run_json: Mapping[str, Any], env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, role) of the host names the job relies on: the rendezvous endpoint's host, the
    MASTER_ADDR, and this host's own name. Addresses are not names and are left out."""
    names: list[tuple[str, str]] = []
    argv = run_json.get("torchrun")
    if isinstance(argv, list):
        for i, arg in enumerate(argv[:-1]):
            if arg in ("--rdzv-endpoint", "--rdzv_endpoint") and isinstance(argv[i + 1], str):
                host = argv[i + 1].rsplit(":", 1)[0].strip("[]")
                names.append((host, "rendezvous endpoint"))
    master = env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR")
    if master:
        names.append((master, "MASTER_ADDR"))
    names.append((socket.gethostname(), "this host's name"))
    out: list[tuple[str, str]] = []
    for name, role in names:
        try:
            ipaddress.ip_address(name)
            continue
        except ValueError:
            pass
        if name and all(name != n for n, _ in out):
            out.append((name, role))
    return out[:4]


class NetWatch:
    """This node's side: when to look, the look itself, and the names the job relies on."""

    def __init__(
        self,
        run: RunDir,
        node_rank: int | None,
        names: Sequence[tuple[str, str]] = (),
        host: str | None = None,
    ) -> None:
        self.run = run
        self.node_rank = node_rank or 0
        self.host = host or socket.gethostname()
        self._names = list(names)
        self._before: dict[str, tuple[tuple[str, ...], str | None, float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._looked_t: float | None = None  # the latest look of this stall
        self._written = False
        self._names_t: float | None = None
        self.looks = 0
        self.changed_names: tuple[NameView, ...] = ()
        # the look this launcher wrote last, held here: its own node's look is this one, never
        # the file read back (any process of the job can write that file)
        self.latest: NodeNetwork | None = None

    # -- the names ----------------------------------------------------------------------------

    def _name_views(self) -> tuple[NameView, ...]:
        views = []
        for name, role in self._names:
            now, error, took = resolve(name)
            before = self._before.setdefault(name, (now, error, took))
            views.append(
                NameView(name, role, before[0] if before[1] is None else (), now, error, took)
            )
        return tuple(views)

    def _check_names(self) -> None:
        views = self._name_views()
        changed = tuple(v for v in views if v.before is not None and set(v.before) != set(v.now))
        with self._lock:
            self.changed_names = changed
        if changed and self._looked_t is None:
            self._write(self._report(time.time(), 0.0, (), (), views))

    # -- the look -------------------------------------------------------------------------------

    def observe(
        self,
        views: Iterable[Any],
        pids: Mapping[int, int],
        now: float,
        hang_after_s: float,
        hosts: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        """Called at every poll with this node's rank views and pids (rank -> pid): starts a
        look when every one of them has made no progress for `hang_after_s`, or the names'
        check when it is due; never waits for either. `hosts`: the job's hosts, asked only
        for a look."""
        if self._thread is not None and self._thread.is_alive():
            return
        views = [v for v in views if v.rank in pids]
        stalled_s = _stalled_for(views, now)
        if stalled_s is None or stalled_s < hang_after_s:
            if self._looked_t is not None:
                self._looked_t = None
                self._remove()  # progressing again: the look is history
            if self._names and (self._names_t is None or now - self._names_t >= NAMES_EVERY_S):
                self._names_t = now
                self._start(self._check_names)
            return
        if self._looked_t is not None and now - self._looked_t < LOOK_EVERY_S:
            return
        self._looked_t = now
        others = sorted({h for h in hosts() if h and h != self.host})[:MAX_PEERS]
        self._start(lambda: self._look(dict(pids), now, stalled_s, others))

    def _start(self, target) -> None:
        self._thread = threading.Thread(target=target, name="ddpdoctor-net", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _look(
        self, pids: dict[int, int], now: float, stalled_s: float, hosts: Sequence[str] = ()
    ) -> None:
        addresses = local_addresses()
        own = {a for a, _, _ in addresses}
        conns = tcp_diag.connections_of(list(pids.values()))
        listening: set[int] = set()
        links: list[LinkView] = []
        for rank, pid in sorted(pids.items()):
            for c in conns.get(pid, ()):
                if c.state == "LISTEN":
                    listening.add(c.local_port)
                elif not is_loopback(c.peer) and c.peer not in own:
                    links.append(_link_view(rank, c))
        links.sort(key=lambda link: (-link.send_q, -link.retransmits, link.rank))
        links = links[:MAX_LINKS]
        self.looks += 1
        probes = [
            ProbeView(r.addr, r.port, r.answered, r.outcome, round(r.ms, 1))
            for r in peer_probe.probe_all(_probe_targets(links, listening))
        ]
        names = self._name_views() if self._names else ()
        # the other hosts' names as this host resolves them: the peers' addresses named even
        # before their own looks come (only to name them; not compared over time)
        known = {view.name for view in names}
        for host in hosts:
            if host not in known:
                found, error, took = resolve(host)
                names = (*names, NameView(host, "a host of the job", None, found, error, took))
        self._write(self._report(now, stalled_s, links, probes, names[:MAX_NAMES], addresses))

    def _report(self, now, stalled_s, links, probes, names, addresses=None) -> NodeNetwork:
        return NodeNetwork(
            node_rank=self.node_rank,
            host=self.host,
            t=now,
            stalled_s=round(stalled_s, 1),
            addresses=addresses if addresses is not None else local_addresses(),
            links=tuple(links),
            probes=tuple(probes),
            names=tuple(names),
        )

    def _write(self, report: NodeNetwork) -> None:
        self.latest = report
        with contextlib.suppress(OSError):  # a lost look: the diagnosis goes without it
            write_json_atomic(network_path(self.run, self.node_rank), report.to_json())
            self._written = True

    def _remove(self) -> None:
        self.latest = None
        if self._written:
            with contextlib.suppress(OSError):
                os.unlink(network_path(self.run, self.node_rank))
            self._written = False


def _stalled_for(views: Sequence[Any], now: float) -> float | None:
    """How long every one of `views` has made no progress; None when one runs or finished."""
    if not views:
        return None
    latest = None
    for view in views:
        if view.state not in _STALLED or view.alive is False:
            return None
        t = view.last_progress_t
        if t is None:
            return None
        latest = t if latest is None else max(latest, t)
    return max(0.0, now - latest) if latest is not None else None


def _link_view(rank: int, c: tcp_diag.Connection) -> LinkView:
    return LinkView(
        rank=rank,
        local=c.local,
        local_port=c.local_port,
        peer=c.peer,
        peer_port=c.peer_port,
        state=c.state,
        send_q=c.send_q,
        recv_q=c.recv_q,
        retransmits=c.retransmits,
        total_retrans=c.total_retrans,
        last_ack_ms=c.last_ack_ms,
        segs_in=c.segs_in,
        segs_out=c.segs_out,
    )


def _probe_targets(links: Sequence[LinkView], listening: set[int]) -> list[tuple[str, int]]:
    """One (address, port) per peer host: a port that listens there when one is known (a
    connection this side opened goes to the peer's listening port), else any of its ports (a
    refusal answers too)."""
    chosen: dict[str, int] = {}
    for link in links:
        opened_here = link.local_port not in listening
        if link.peer not in chosen or opened_here:
            if link.peer in chosen and not opened_here:
                continue
            chosen[link.peer] = link.peer_port
    return list(chosen.items())[:MAX_PEERS]


def read_report(path: Path) -> NodeNetwork | None:
    """One node's network.json: a regular file only, bounded; None when absent or not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_REPORT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        return node_network_from_json(jsontext.loads(data))
    except ValueError:
        return None


class NetReports:
    """Node 0's (or a watcher's) side: every node's latest report, reread when it changed."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._cache: dict[int, tuple[tuple[int, int], NodeNetwork | None]] = {}

    def read(self, nodes: Iterable[int]) -> tuple[NodeNetwork, ...]:
        out = []
        for node in sorted(set(nodes)):
            path = network_path(self.run, node)
            try:
                st = os.stat(path)
            except OSError:
                self._cache.pop(node, None)
                continue
            key = (st.st_ino, st.st_mtime_ns)
            cached = self._cache.get(node)
            if cached is None or cached[0] != key:
                cached = (key, read_report(path))
                self._cache[node] = cached
            if cached[1] is not None:
                out.append(cached[1])
        return tuple(out)
