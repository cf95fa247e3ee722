"""Network checks with injected facts: ports, master address, host name, interfaces."""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field

import pytest

from ddpdoctor.checks import net_facts, network
from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.probes.net import (
    BindAttempt,
    BindResult,
    ConnectResult,
    NetInterface,
    PortOwner,
    Resolution,
)

LO = NetInterface("lo", True, ("127.0.0.1",), ("::1",))
ETH = NetInterface("eth0", True, ("10.0.0.5",), ("fe80::1%eth0",))
NEVER = threading.Event()  # never set: a resolver that waits on it never answers


@dataclass
class FakeNet:
    """Recorded network facts; `resolved` maps a name to its addresses (missing: does not resolve)."""

    name: str = "node1"
    resolved: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"node1": ("10.0.0.5",), "localhost": ("127.0.0.1",)}
    )
    ifaces: list[NetInterface] = field(default_factory=lambda: [LO, ETH])
    bind: BindResult | None = None
    owners: list[PortOwner] = field(default_factory=list)
    connect_outcome: str = "connected"
    stuck_resolver: bool = False
    stuck_connect: bool = False
    calls: list[str] = field(default_factory=list)

    def interfaces(self):
        return list(self.ifaces)

    def hostname(self):
        return self.name

    def resolve(self, host):
        self.calls.append(f"resolve {host}")
        if self.stuck_resolver:
            NEVER.wait()
        if host in self.resolved:
            return Resolution(host, self.resolved[host])
        if net_facts._ip(host) is not None:  # an address literal resolves to itself
            return Resolution(host, (host,))
        return Resolution(host, error="Name or service not known")

    def bind_test(self, port):
        self.calls.append(f"bind {port}")
        return self.bind or BindResult(
            port, (BindAttempt("::", True), BindAttempt("0.0.0.0", True))
        )

    def port_owners(self, port):
        return list(self.owners)

    def connect(self, host, port, timeout_s=2.0):
        self.calls.append(f"connect {host}:{port}")
        if self.stuck_connect:
            NEVER.wait()
        return ConnectResult(host, port, self.connect_outcome, error=self.connect_outcome)

    def free_port(self):
        return 41234

    def ancestor_pids(self):
        return frozenset({100, 99})  # this process and the launcher that started it


def ctx(env=None, net=None, **options) -> CheckContext:
    return CheckContext(
        env=env or {},
        options=DoctorOptions(smoke=False, **options),
        probes=Probes(net=net or FakeNet()),
    )


@pytest.fixture
def fast_timeouts(monkeypatch):
    monkeypatch.setattr(net_facts, "RESOLVE_TIMEOUT_S", 0.1)
    monkeypatch.setattr(network, "CONNECT_TIMEOUT_S", 0.1)


IN_USE = BindResult(
    29500,
    (
        BindAttempt("::", False, errno.EADDRINUSE, "Address already in use"),
        BindAttempt("0.0.0.0", False, errno.EADDRINUSE, "Address already in use"),
    ),
)


# --- helpers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "reading"),
    [("6841231", "0.104.99.143"), ("10", "0.0.0.10"), ("node7", None), ("10.0.0.1", None)],
)
def test_numeric_host_reading(host, reading):
    assert net_facts.numeric_host_reading(host) == reading


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.1", False)],
)
def test_is_loopback(address, loopback):
    assert net_facts.is_loopback(address) is loopback


# --- master port ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "options", "needle"),
    [
        ({"MASTER_PORT": "99999"}, {}, "MASTER_PORT=99999 is outside the TCP port range"),
        ({"MASTER_PORT": "0"}, {}, "MASTER_PORT=0 is outside"),
        ({"MASTER_PORT": "http"}, {}, "MASTER_PORT='http' is not a port number"),
        ({}, {"master_port": 70000}, "--master-port=70000 is outside"),
        ({}, {"init_method": "tcp://10.0.0.1:99999"}, "the port 99999 of tcp://10.0.0.1:99999 is"),
    ],
)
def test_bad_master_port_is_a_named_failure(env, options, needle):
    result = network.master_port(ctx(env, **options))
    assert result.status is Status.FAIL
    assert needle in result.summary
    assert "1024 and 65535" in result.fix


def test_free_port_on_the_master_passes_and_binds_both_families():
    net = FakeNet()
    result = network.master_port(ctx({"MASTER_PORT": "29511", "MASTER_ADDR": "127.0.0.1"}, net))
    assert result.status is Status.PASS
    assert "bind 29511" in net.calls
    assert result.facts["bind"] == {"::": "ok", "0.0.0.0": "ok"}


def test_unset_port_checks_torchruns_default():
    net = FakeNet()
    result = network.master_port(ctx({}, net))
    assert result.status is Status.PASS and "bind 29500" in net.calls
    assert "29500" in result.details[0]


def test_port_in_use_names_the_owner_and_a_free_port():
    owner = PortOwner(4242, "0.0.0.0:29500", "LISTEN", "python", ("python", "train.py"))
    net = FakeNet(bind=IN_USE, owners=[owner])
    result = network.master_port(ctx({"MASTER_PORT": "29500"}, net))
    assert result.status is Status.FAIL
    assert "pid 4242 (python train.py)" in result.summary
    assert "kill 4242" in result.fix and "MASTER_PORT=41234" in result.fix
    assert "--standalone" in result.fix
    assert result.facts["owners"][0]["pid"] == 4242


def test_port_held_by_the_launcher_that_started_us_is_no_conflict():
    owner = PortOwner(99, "0.0.0.0:29500", "LISTEN", "torchrun", ("torchrun", "--nproc", "2"))
    env = {"MASTER_PORT": "29500", "RANK": "0", "TORCHELASTIC_RUN_ID": "x"}
    result = network.master_port(ctx(env, FakeNet(bind=IN_USE, owners=[owner])))
    assert result.status is Status.PASS and "which started this process" in result.summary
    outside_a_job = network.master_port(
        ctx({"MASTER_PORT": "29500"}, FakeNet(bind=IN_USE, owners=[owner]))
    )
    assert outside_a_job.status is Status.FAIL  # a parent holding the port, but no job: a clash


def test_port_in_use_by_an_invisible_process():
    net = FakeNet(bind=IN_USE, owners=[PortOwner(None, "0.0.0.0:29500", "LISTEN")])
    result = network.master_port(ctx({"MASTER_PORT": "29500"}, net))
    assert result.status is Status.FAIL
    assert "cannot see" in result.summary and "ss -ltnp" in result.fix


def test_privileged_port_cannot_be_bound():
    denied = BindResult(80, (BindAttempt("::", False, errno.EACCES, "Permission denied"),))
    result = network.master_port(ctx({"MASTER_PORT": "80"}, FakeNet(bind=denied)))
    assert result.status is Status.FAIL
    assert "Permission denied" in result.summary and "above 1023" in result.fix


def test_port_is_not_bound_on_a_worker_node():
    net = FakeNet(bind=IN_USE)
    env = {"MASTER_PORT": "29500", "MASTER_ADDR": "10.0.0.9", "RANK": "3"}
    result = network.master_port(ctx(env, net))
    assert result.status is Status.PASS
    assert not any(c.startswith("bind") for c in net.calls)


def test_master_given_as_our_interface_address_is_this_host():
    net = FakeNet(bind=IN_USE)
    result = network.master_port(ctx({"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}, net))
    assert result.status is Status.FAIL  # the port is ours to bind, and it is taken


def test_file_rendezvous_skips_port_and_addr():
    c = ctx({}, init_method="file:///shared/init")
    assert network.master_port(c).status is Status.SKIP
    assert network.master_addr(c).status is Status.SKIP


# --- master address -------------------------------------------------------------------------------


def test_unset_addr_single_node_passes_multi_node_fails():
    assert network.master_addr(ctx({})).status is Status.PASS
    result = network.master_addr(ctx({}, nnodes=2))
    assert result.status is Status.FAIL and "2 nodes" in result.summary


def test_all_digit_host_is_read_as_an_ipv4_number():
    result = network.master_addr(ctx({"MASTER_ADDR": "6841231"}))
    assert result.status is Status.FAIL
    assert "MASTER_ADDR=6841231" in result.summary and "0.104.99.143" in result.summary


def test_unresolvable_master_names_the_host():
    result = network.master_addr(ctx({"MASTER_ADDR": "no.such.host"}))
    assert result.status is Status.FAIL
    assert "MASTER_ADDR=no.such.host does not resolve" in result.summary
    assert "getent hosts no.such.host" in result.fix


def test_a_resolver_that_never_answers_is_bounded(fast_timeouts):
    start = time.monotonic()
    result = network.master_addr(ctx({"MASTER_ADDR": "slow.dns"}, FakeNet(stuck_resolver=True)))
    assert time.monotonic() - start < 2.0
    assert result.status is Status.FAIL
    assert "did not resolve within 0.1 s" in result.summary


def test_loopback_master_in_a_multi_node_job_fails():
    result = network.master_addr(ctx({"MASTER_ADDR": "localhost"}, nnodes=2))
    assert result.status is Status.FAIL and "loopback" in result.summary


def test_a_meeting_point_from_the_rendezvous_endpoint_is_named_as_the_user_gave_it():
    options = {"nnodes": 2, "master_addr": "127.0.0.1", "master_port": 29400}
    result = network.master_addr(ctx({}, address_flag="--rdzv-endpoint", **options))
    assert result.status is Status.FAIL
    assert result.summary.startswith("--rdzv-endpoint=127.0.0.1 is a loopback address")
    assert result.fix.startswith("Set --rdzv-endpoint to the routable IP address")
    plain = network.master_addr(ctx({}, **options))
    assert plain.summary.startswith("--master-addr=127.0.0.1")


def test_link_local_only_master_warns():
    net = FakeNet(resolved={"m": ("169.254.3.4",), "node1": ("10.0.0.5",)})
    result = network.master_addr(ctx({"MASTER_ADDR": "m", "RANK": "1"}, net, nnodes=2))
    assert result.status is Status.WARN and "link-local" in result.summary


def test_master_here_is_not_connected_to():
    net = FakeNet()
    result = network.master_addr(ctx({"MASTER_ADDR": "127.0.0.1"}, net))
    assert result.status is Status.PASS and "this host is the master" in result.summary
    assert not any(c.startswith("connect") for c in net.calls)


@pytest.mark.parametrize(
    ("outcome", "status", "needle"),
    [
        ("connected", Status.PASS, "accepts connections"),
        ("refused", Status.WARN, "nothing listens on 10.0.0.9:29501 yet"),
        ("timeout", Status.FAIL, "timed out"),
        ("unreachable", Status.FAIL, "cannot connect to 10.0.0.9:29501"),
    ],
)
def test_worker_connects_to_the_master(outcome, status, needle):
    net = FakeNet(
        resolved={"10.0.0.9": ("10.0.0.9",), "node1": ("10.0.0.5",)}, connect_outcome=outcome
    )
    env = {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29501", "RANK": "2"}
    result = network.master_addr(ctx(env, net, nnodes=2))
    assert result.status is status
    assert needle in result.summary
    assert "connect 10.0.0.9:29501" in net.calls


def test_a_connect_that_never_returns_is_bounded(fast_timeouts):
    net = FakeNet(resolved={"10.0.0.9": ("10.0.0.9",)}, stuck_connect=True)
    start = time.monotonic()
    result = network.master_addr(ctx({"MASTER_ADDR": "10.0.0.9", "RANK": "1"}, net))
    assert time.monotonic() - start < 2.0
    assert result.status is Status.FAIL and "timed out" in result.summary


# --- host name ------------------------------------------------------------------------------------


def test_hostname_on_loopback_passes_with_a_note_on_one_node():
    net = FakeNet(resolved={"vm": ("127.0.0.1",)}, name="vm")
    result = network.hostname(ctx({}, net))
    assert result.status is Status.PASS
    assert "loopback" in result.summary and "GLOO_SOCKET_IFNAME" in result.details[0]


def test_hostname_on_loopback_fails_multi_node_without_gloo_ifname():
    net = FakeNet(resolved={"vm": ("127.0.1.1",)}, name="vm")
    result = network.hostname(ctx({}, net, nnodes=2))
    assert result.status is Status.FAIL
    assert "127.0.1.1" in result.summary
    assert "GLOO_SOCKET_IFNAME=eth0" in result.fix and "instead of 127.0.1.1" in result.fix


@pytest.mark.parametrize(
    ("master", "status"),
    [("10.0.0.9", Status.FAIL), ("10.0.0.5", Status.PASS), ("127.0.0.1", Status.PASS)],
)
def test_a_master_on_another_machine_makes_a_loopback_host_name_fail(master, status):
    """RANK=1 with MASTER_ADDR of another machine spans hosts even without NNODES."""
    net = FakeNet(resolved={"vm": ("127.0.1.1",)}, name="vm")
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": master}
    assert network.hostname(ctx(env, net)).status is status


def test_hostname_on_loopback_with_gloo_ifname_passes():
    net = FakeNet(resolved={"vm": ("127.0.1.1",)}, name="vm")
    result = network.hostname(ctx({"GLOO_SOCKET_IFNAME": "eth0"}, net, nnodes=2))
    assert result.status is Status.PASS and "GLOO_SOCKET_IFNAME=eth0" in result.summary


@pytest.mark.parametrize(("nnodes", "status"), [(None, Status.WARN), (2, Status.FAIL)])
def test_unresolvable_hostname(nnodes, status):
    net = FakeNet(resolved={}, name="ghost")
    result = network.hostname(ctx({}, net, nnodes=nnodes))
    assert result.status is status
    assert "'ghost' does not resolve" in result.summary and "/etc/hosts" in result.fix


def test_routable_hostname_passes():
    result = network.hostname(ctx({}, FakeNet(), nnodes=2))
    assert result.status is Status.PASS and "10.0.0.5" in result.summary


def test_hostname_with_a_stuck_resolver_is_bounded(fast_timeouts):
    start = time.monotonic()
    result = network.hostname(ctx({}, FakeNet(stuck_resolver=True)))
    assert time.monotonic() - start < 2.0
    assert result.status is Status.WARN and "no answer within 0.1 s" in result.summary


# --- interfaces -----------------------------------------------------------------------------------


def test_no_interface_up_fails():
    down = [NetInterface("lo", False), NetInterface("eth0", False)]
    result = network.interfaces(ctx({}, FakeNet(ifaces=down)))
    assert result.status is Status.FAIL and "not even loopback" in result.summary


def test_only_loopback_fails_for_multi_node_but_passes_single_node():
    result = network.interfaces(ctx({}, FakeNet(ifaces=[LO]), nnodes=3))
    assert result.status is Status.FAIL and "3 nodes" in result.summary
    assert network.interfaces(ctx({}, FakeNet(ifaces=[LO]))).status is Status.PASS


def test_loopback_down_fails_single_node():
    result = network.interfaces(ctx({}, FakeNet(ifaces=[NetInterface("lo", False), ETH])))
    assert result.status is Status.FAIL and "loopback interface is down" in result.summary


def test_interfaces_are_listed_in_facts():
    result = network.interfaces(ctx({}, FakeNet()))
    assert result.status is Status.PASS and "eth0 (10.0.0.5)" in result.summary
    assert {i["name"] for i in result.facts["interfaces"]} == {"lo", "eth0"}
