"""The TCP connections of a process, read as `ss -ti` reads them (netlink inet_diag) and from
/proc/<pid>/net/tcp: real sockets of this test process, on loopback."""

from __future__ import annotations

import os
import socket
import time

import pytest

from ddpdoctor.monitor.follow import peer_probe, tcp_diag


@pytest.fixture
def pair():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname(), timeout=5)
    server, _ = listener.accept()
    yield listener, client, server
    for s in (client, server, listener):
        s.close()


def _mine(conns, client):
    port = client.getsockname()[1]
    return next(c for c in conns if c.local_port == port and c.state == "ESTAB")


def test_this_process_connections_come_with_their_peer_and_queues(pair):
    listener, client, server = pair
    server.sendall(b"x" * 1000)  # unread by the client: its receive queue
    time.sleep(0.2)
    conns = tcp_diag.connections_of([os.getpid()])[os.getpid()]
    mine = _mine(conns, client)
    assert (mine.peer, mine.peer_port) == ("127.0.0.1", listener.getsockname()[1])
    assert mine.recv_q == 1000
    assert any(c.state == "LISTEN" and c.local_port == listener.getsockname()[1] for c in conns)


def test_netlink_carries_tcp_info_as_ss_shows_it(pair):
    _listener, client, server = pair
    client.sendall(b"y" * 10)
    server.recv(10)
    table = tcp_diag.inet_diag()
    if table is None:
        pytest.skip("netlink inet_diag refused here")
    mine = _mine(table, client)
    assert mine.segs_out is not None and mine.segs_out >= 2  # the SYN and the data at least
    assert mine.last_ack_ms is not None and mine.last_ack_ms < 60_000
    assert mine.retransmits == 0 and mine.total_retrans == 0


def test_proc_table_reads_the_same_connection(pair):
    listener, client, _server = pair
    table = tcp_diag.proc_table(os.getpid())
    assert table is not None
    mine = _mine(table, client)
    assert mine.peer_port == listener.getsockname()[1]
    assert mine.inode in tcp_diag.socket_inodes(os.getpid())


def test_proc_lines_that_are_not_connections_are_skipped():
    assert tcp_diag.parse_proc_line("garbage", socket.AF_INET) is None
    line = (
        "   0: 0100007F:1F90 0100007F:C350 01 00000010:00000000 00:00000000 00000003 "
        "0 0 12345 1 0000000000000000 20 4 30 10 -1"
    )
    conn = tcp_diag.parse_proc_line(line, socket.AF_INET)
    assert conn is not None
    assert (conn.local, conn.local_port, conn.peer_port) == ("127.0.0.1", 8080, 50000)
    assert (conn.send_q, conn.retransmits, conn.inode) == (16, 3, 12345)


def test_a_probe_answers_or_is_refused_on_loopback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        ok = peer_probe.probe("127.0.0.1", s.getsockname()[1])
        port = s.getsockname()[1]
    assert ok.answered and ok.outcome == "connected"
    refused = peer_probe.probe("127.0.0.1", port)
    assert refused.answered and refused.outcome == "refused"
