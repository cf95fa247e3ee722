"""The TCP connections of a rank's process, as `ss -ti` shows them: peer, queues, retransmits,
time since the last ACK and segment counts.

A process's sockets are the `socket:[inode]` links under /proc/<pid>/fd; the kernel's socket
table says what each one is. The table comes from netlink's inet_diag (what `ss` asks, with each
connection's `tcp_info`), or, where netlink is refused, from /proc/<pid>/net/tcp and tcp6 (queues,
retransmit timer and count only). Both are the table of the network namespace the reader is in:
a launcher reads its own host's ranks, never another host's.

Every read is bounded: at most MAX_FDS descriptors per process, MAX_SOCKETS entries per table,
and a netlink dump that stops after MAX_DUMP_BYTES.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass

MAX_FDS = 4096
MAX_SOCKETS = 65536
MAX_DUMP_BYTES = 64 << 20
MAX_PROC_TABLE_BYTES = 16 << 20

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
ESTABLISHED = 1
# The states worth reading: a connection that carries data, or one that is still trying.
_STATES = {1: "ESTAB", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 8: "CLOSE-WAIT", 10: "LISTEN"}
_STATE_MASK = sum(1 << s for s in _STATES)


@dataclass(frozen=True)
class Connection:
    """One TCP socket of a process (times in ms, as tcp_info has them; None when not known)."""

    inode: int
    state: str
    local: str
    local_port: int
    peer: str
    peer_port: int
    send_q: int  # bytes not yet acknowledged by the peer (ESTAB) / the backlog (LISTEN)
    recv_q: int  # bytes received, not yet read by the process
    retransmits: int  # consecutive retransmissions of the oldest unacknowledged segment
    total_retrans: int | None = None
    unacked: int | None = None  # segments in flight
    last_ack_ms: int | None = None  # since the last ACK came in
    last_recv_ms: int | None = None  # since the last data came in
    last_send_ms: int | None = None  # since data was last sent
    segs_in: int | None = None
    segs_out: int | None = None
    backoff: int | None = None  # the retransmit timer's exponent (rto doubled that many times)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of `pid`'s sockets (empty when it is gone or not readable)."""
    found: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        with os.scandir(fd_dir) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FDS:
                    break
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target.startswith("socket:[") and target.endswith("]"):
                    with contextlib.suppress(ValueError):
                        found.add(int(target[8:-1]))
    except OSError:
        pass
    return found


def connections_of(pids: Collection[int]) -> dict[int, list[Connection]]:
    """pid -> its TCP connections (listening sockets included), from one table read."""
    inodes = {pid: socket_inodes(pid) for pid in pids}
    wanted = set().union(*inodes.values()) if inodes else set()
    if not wanted:
        return {pid: [] for pid in pids}
    table = _by_inode(inet_diag(), wanted)
    if table is None:
        table = {}
        for pid in pids:  # /proc/<pid>/net is the table of that process's namespace
            table.update(_by_inode(proc_table(pid), wanted) or {})
    return {
        pid: sorted((table[i] for i in inodes[pid] if i in table), key=lambda c: c.inode)
        for pid in pids
    }


def _by_inode(conns: Iterable[Connection] | None, wanted: set[int]) -> dict[int, Connection] | None:
    if conns is None:
        return None
    return {c.inode: c for c in conns if c.inode in wanted}


# -- netlink inet_diag -------------------------------------------------------------------------


def inet_diag() -> list[Connection] | None:
    """Every TCP socket of this network namespace with its tcp_info; None where netlink is not
    allowed (the caller falls back to /proc)."""
    out: list[Connection] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                if not _dump(nl, family, seq, out):
                    return None
    except OSError:
        return None
    return out


def _dump(nl: socket.socket, family: int, seq: int, out: list[Connection]) -> bool:
    # inet_diag_req_v2: family, protocol, ext (the tcp_info attribute), pad, states, sockid
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), _STATE_MASK)
    req += bytes(48)
    header = struct.pack(
        "=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    nl.sendall(header + req)
    read = 0
    while True:
        data = nl.recv(1 << 16)
        read += len(data)
        if not data or read > MAX_DUMP_BYTES:
            return False
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, offset)
            if length < 16 or offset + length > len(data):
                return False
            if kind == NLMSG_DONE:
                return True
            if kind == NLMSG_ERROR:
                return False
            if kind == SOCK_DIAG_BY_FAMILY and len(out) < MAX_SOCKETS:
                conn = _diag_message(data[offset + 16 : offset + length], family)
                if conn is not None:
                    out.append(conn)
            offset += (length + 3) & ~3


def _address(raw: bytes, family: int) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    addr = ipaddress.IPv6Address(raw[:16])
    mapped = addr.ipv4_mapped
    return str(mapped) if mapped is not None else str(addr)


def _diag_message(msg: bytes, family: int) -> Connection | None:
    # inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue,
    # wqueue, uid, inode; then attributes
    if len(msg) < 72:
        return None
    _fam, state, _timer, retrans = struct.unpack_from("=BBBB", msg, 0)
    sport, dport = struct.unpack_from("!HH", msg, 4)
    src, dst = msg[8:24], msg[24:40]
    rqueue, wqueue, _uid, inode = struct.unpack_from("=IIII", msg, 56)
    info = None
    offset = 72
    while offset + 4 <= len(msg):
        alen, atype = struct.unpack_from("=HH", msg, offset)
        if alen < 4:
            break
        if atype == INET_DIAG_INFO:
            info = msg[offset + 4 : offset + alen]
        offset += (alen + 3) & ~3
    conn = Connection(
        inode=inode,
        state=_STATES.get(state, str(state)),
        local=_address(src, family),
        local_port=sport,
        peer=_address(dst, family),
        peer_port=dport,
        send_q=wqueue,
        recv_q=rqueue,
        retransmits=retrans,
    )
    return _with_tcp_info(conn, info) if info else conn


def _with_tcp_info(conn: Connection, info: bytes) -> Connection:
    # struct tcp_info (linux/tcp.h): 8 bytes of u8 fields, then u32s from offset 8
    if len(info) < 104:
        return conn
    retransmits, _probes, backoff = info[2], info[3], info[4]
    u32 = struct.unpack_from("=24I", info, 8)
    unacked, last_send, last_recv, last_ack, total_retrans = (
        u32[4],
        u32[9],
        u32[11],
        u32[12],
        u32[23],
    )
    segs_out = segs_in = None
    if len(info) >= 144:
        segs_out, segs_in = struct.unpack_from("=II", info, 136)
    return Connection(
        **{
            **conn.__dict__,
            "retransmits": max(conn.retransmits, retransmits),
            "total_retrans": total_retrans,
            "unacked": unacked,
            "last_ack_ms": last_ack,
            "last_recv_ms": last_recv,
            "last_send_ms": last_send,
            "segs_in": segs_in,
            "segs_out": segs_out,
            "backoff": backoff,
        }
    )


# -- /proc/<pid>/net/tcp ------------------------------------------------------------------------


def proc_table(pid: int) -> list[Connection] | None:
    """The TCP sockets of `pid`'s network namespace from /proc (no tcp_info: queues, the
    retransmit count); None when neither file can be read."""
    out: list[Connection] = []
    read_any = False
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{name}", "rb") as f:
                text = f.read(MAX_PROC_TABLE_BYTES)
        except OSError:
            continue
        read_any = True
        for line in text.splitlines()[1:MAX_SOCKETS]:
            conn = parse_proc_line(line.decode("ascii", "replace"), family)
            if conn is not None:
                out.append(conn)
    return out if read_any else None


def _proc_address(text: str, family: int) -> tuple[str, int]:
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    # /proc prints each 32-bit word in host order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _address(words, family), int(port, 16)


def parse_proc_line(line: str, family: int) -> Connection | None:
    """One line of /proc/net/tcp or tcp6 (`sl local rem st tx:rx tr:when retrnsmt uid timeout
    inode ...`), or None when it is not one."""
    parts = line.split()
    if len(parts) < 10:
        return None
    try:
        local, local_port = _proc_address(parts[1], family)
        peer, peer_port = _proc_address(parts[2], family)
        state = int(parts[3], 16)
        tx, _, rx = parts[4].partition(":")
        retrans = int(parts[6], 16)
        inode = int(parts[9])
        send_q, recv_q = int(tx, 16), int(rx, 16)
    except ValueError:
        return None
    if state not in _STATES:
        return None
    return Connection(
        inode=inode,
        state=_STATES[state],
        local=local,
        local_port=local_port,
        peer=peer,
        peer_port=peer_port,
        send_q=send_q,
        recv_q=recv_q,
        retransmits=retrans,
    )
