"""The rank socket: a process says its rank to the launcher and the kernel names its pid, which
the launcher can still read after the process has ended; nothing can say it for another pid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpdoctor.protocol.rank_socket import (
    ENV_RANK_SOCKET,
    MAX_ACCEPTS,
    MAX_PENDING,
    RankSocket,
    say_rank,
)

SAY = "import sys; from ddpdoctor.protocol.rank_socket import say_rank; say_rank(int(sys.argv[1]))"


@pytest.fixture
def sock():
    opened = RankSocket.open()
    assert opened is not None
    yield opened
    opened.close()


def said_in_a_child(sock: RankSocket, rank: int) -> subprocess.Popen:
    """A process that said `rank` to the socket and ended."""
    env = {**os.environ, ENV_RANK_SOCKET: str(sock.path)}
    child = subprocess.Popen([sys.executable, "-c", SAY, str(rank)], env=env)
    assert child.wait(timeout=60) == 0
    return child


def test_a_process_that_ended_is_known_by_the_pid_the_kernel_named(sock):
    child = said_in_a_child(sock, 3)
    assert sock.rank_of(child.pid) == 3  # read after it ended
    assert sock.rank_of(os.getpid()) is None


def test_a_pids_latest_word_counts_and_a_line_that_is_no_rank_says_nothing(sock):
    assert say_rank(1, str(sock.path)) and say_rank(2, str(sock.path))
    assert sock.rank_of(os.getpid()) == 2
    for junk in (b"rank one\n", b"9" * 40 + b"\n", b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(sock.path))
            raw.send(junk)
    sock.collect()
    assert sock._said == {os.getpid(): 2}


def test_a_word_vouches_only_until_another_process_says_that_rank(sock):
    """A restart: the first process said rank 1 and ended, the next one said rank 1 too. The
    first pid's word is spent: a hello naming it later is nobody's."""
    first = said_in_a_child(sock, 1)
    assert sock.rank_of(first.pid) == 1
    assert say_rank(1, str(sock.path))  # the restarted rank (this process)
    assert sock.rank_of(os.getpid()) == 1
    assert sock.rank_of(first.pid) is None


def test_a_job_connecting_in_a_loop_cannot_hold_a_collection():
    sock = RankSocket.open()
    assert sock is not None
    conns = []
    try:
        for _ in range(MAX_ACCEPTS + 40):  # silent connections: each would wait for its line
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(str(sock.path))
            conns.append(raw)
        sock.collect()
        assert len(sock._pending) <= MAX_PENDING
    finally:
        for raw in conns:
            raw.close()
        sock.close()


def test_a_word_not_sent_yet_is_read_at_a_later_collection(sock):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(sock.path))
        assert sock.rank_of(os.getpid()) is None  # connected, nothing said yet
        raw.send(b"4\n")
    assert sock.rank_of(os.getpid()) == 4


def test_nobody_listening_costs_the_rank_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_RANK_SOCKET, raising=False)
    assert say_rank(0) is False  # not launched by ddpdoctor run
    t0 = time.monotonic()
    assert say_rank(0, str(tmp_path / "no-such-socket")) is False
    sock = RankSocket.open()
    assert sock is not None
    path = sock.path
    sock.close()  # the launcher has gone: its directory with it
    assert not path.parent.exists()
    assert say_rank(0, str(path)) is False
    assert time.monotonic() - t0 < 1.0


def test_what_was_said_stays_known_after_the_socket_closed():
    sock = RankSocket.open()
    assert sock is not None
    assert say_rank(5, str(sock.path))
    sock.close()  # (collects what waits first)
    assert sock.rank_of(os.getpid()) == 5


def test_only_a_rank_sockets_own_directory_is_removed_as_left_behind(tmp_path):
    import tempfile

    from ddpdoctor.protocol.rank_socket import remove_left_behind

    sock = RankSocket.open()
    assert sock is not None
    sock._sock.close()  # (its launcher was killed: the socket file stays)
    assert remove_left_behind(str(sock.directory)) and not sock.directory.exists()
    # not named like one, not in the temporary directory, a link, or holding anything else
    other = Path(tempfile.mkdtemp(prefix="someone-"))
    nested = tmp_path / "ddpdoctor-x"
    nested.mkdir()
    crowded = Path(tempfile.mkdtemp(prefix="ddpdoctor-"))
    (crowded / "notes").write_text("mine")
    link = Path(tempfile.gettempdir()) / f"ddpdoctor-link-{os.getpid()}"
    link.symlink_to(other)
    try:
        for path in (other, nested, crowded, link):
            assert not remove_left_behind(str(path)) and path.exists()
        assert (crowded / "notes").read_text() == "mine"
    finally:
        link.unlink()
        other.rmdir()
        (crowded / "notes").unlink()
        crowded.rmdir()
