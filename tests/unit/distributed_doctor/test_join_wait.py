"""Joining at a MASTER_ADDR whose name does not resolve yet (a Kubernetes headless service's
name appears once its pod is ready), or whose DNS server never answers: retried until the
deadline, never past it, with how long it took.

Every resolver here is the test's own (no query leaves the machine); connects go to a real
listener on 127.0.0.1.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ddpdoctor.distributed_doctor import join


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def _answer(port: int, address: str = "127.0.0.1") -> list:
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]


def _no_such_name(host, port, **_):
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_a_name_that_resolves_late_is_waited_for_and_timed(listener):
    appears = time.monotonic() + 0.6
    asked: list[str] = []

    def resolver_that_learns_late(host, port, **_):
        asked.append(host)
        if time.monotonic() < appears:
            return _no_such_name(host, port)
        return _answer(port)

    reached = join.wait_until_reached(
        "master.late", listener, time.monotonic() + 10, getaddrinfo=resolver_that_learns_late
    )
    assert reached.connect_ms >= 0 and reached.address == "127.0.0.1"
    assert reached.name_wait_s is not None and 0.3 <= reached.name_wait_s <= 2.0
    assert reached.addresses == ("127.0.0.1",) and set(asked) == {"master.late"}


def test_a_name_that_resolves_at_once_has_no_wait(listener):
    reached = join.wait_until_reached("127.0.0.1", listener, time.monotonic() + 5)
    assert reached.name_wait_s is None and reached.address == "127.0.0.1"


def test_a_name_that_never_resolves_says_so_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(join.JoinError, match=r"master\.never does not resolve") as caught:
        join.wait_until_reached(
            "master.never", 29500, time.monotonic() + 0.5, getaddrinfo=_no_such_name
        )
    assert time.monotonic() - start < 5
    assert caught.value.unresolved
    assert caught.value.why == "master.never does not resolve: Name or service not known"


def test_a_dns_server_that_never_answers_costs_the_deadline_and_no_more():
    release = threading.Event()

    def never_answers(host, port, **_):  # getaddrinfo blocked in the C library
        release.wait(30)
        return _no_such_name(host, port)

    try:
        start = time.monotonic()
        with pytest.raises(join.JoinError, match="no answer from the DNS server") as caught:
            join.wait_until_reached(
                "ddp-0.ddp",
                29500,
                time.monotonic() + 1.0,
                names="PET_MASTER_ADDR:PET_MASTER_PORT",
                getaddrinfo=never_answers,
            )
        assert 0.9 <= time.monotonic() - start < 1.6
        assert caught.value.unresolved
        assert "nothing answered at PET_MASTER_ADDR:PET_MASTER_PORT ddp-0.ddp:29500" in str(
            caught.value
        )
    finally:
        release.set()


def test_once_the_name_resolves_our_own_port_gets_connect_within_not_the_whole_deadline():
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(join.JoinError, match="refused") as caught:
        join.wait_until_reached(
            "master.here",
            closed,
            time.monotonic() + 30,
            connect_within=0.5,
            getaddrinfo=lambda host, port, **_: _answer(port),
        )
    assert time.monotonic() - start < 3 and not caught.value.unresolved
    assert "master.here is this host itself" in str(caught.value)  # it resolved to loopback


def test_a_name_that_resolves_late_gets_connect_within_from_when_it_resolved(listener):
    appears = time.monotonic() + 1.0

    def late(host, port, **_):
        return _no_such_name(host, port) if time.monotonic() < appears else _answer(port)

    reached = join.wait_until_reached(
        "ddp-0.ddp", listener, time.monotonic() + 10, connect_within=0.5, getaddrinfo=late
    )
    assert reached.name_wait_s is not None and reached.name_wait_s >= 0.7
