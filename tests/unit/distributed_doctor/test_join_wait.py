"""Joining at a MASTER_ADDR whose name does not resolve yet (a Kubernetes headless service's
name appears once its pod is ready): retried until the deadline, with how long it took."""

from __future__ import annotations

import socket
import time

import pytest

from ddpdoctor.distributed_doctor import join


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_a_name_that_resolves_late_is_waited_for_and_timed(tmp_path, listener, monkeypatch):
    appears = time.monotonic() + 0.6
    real = socket.create_connection

    def resolver_that_learns_late(address, timeout=None):
        host, port = address
        if host == "master.late" and time.monotonic() < appears:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(("127.0.0.1", port), timeout=timeout)

    monkeypatch.setattr(join.socket, "create_connection", resolver_that_learns_late)
    connect_ms, waited = join.wait_until_reached("master.late", listener, time.monotonic() + 10)
    assert connect_ms >= 0 and waited is not None and 0.3 <= waited <= 2.0


def test_a_name_that_resolves_at_once_has_no_wait(listener):
    _, waited = join.wait_until_reached("127.0.0.1", listener, time.monotonic() + 5)
    assert waited is None


def test_a_name_that_never_resolves_says_so_at_the_deadline(monkeypatch):
    def no_such_name(address, timeout=None):  # (no resolver is asked: no traffic leaves)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(join.socket, "create_connection", no_such_name)
    start = time.monotonic()
    with pytest.raises(join.JoinError, match=r"master\.never does not resolve"):
        join.wait_until_reached("master.never", 29500, time.monotonic() + 0.5)
    assert time.monotonic() - start < 5
