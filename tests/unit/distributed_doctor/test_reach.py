"""The reachability probe: gloo's choice of address, the token listener and connects (real sockets
on loopback), and the judgement of recorded probes from two-node lab runs."""

from __future__ import annotations

import socket
import time

from ddpdoctor.checks.probes.net import NetInterface
from ddpdoctor.distributed_doctor.nodes import Member, NodeMap
from ddpdoctor.distributed_doctor.reach import (
    Address,
    Listener,
    Probe,
    connect_once,
    gloo_choice,
    local_addresses,
    probe_peers,
    token,
)
from ddpdoctor.distributed_doctor.reach_verdict import Reach, group_blocker, judge_reach

ADDRS = [Address("lo", "127.0.0.1"), Address("eth0", "198.18.0.11"), Address("eth1", "198.19.0.11")]
NODES = NodeMap.build([Member(0, "h1", 0), Member(1, "h2", 1)])


def test_local_addresses_keep_ipv4_of_interfaces_that_are_up():
    found = [
        NetInterface("lo", True, ("127.0.0.1",), ("::1",)),
        NetInterface("eth0", True, ("198.18.0.11",), ("fe80::1",)),
        NetInterface("eth9", False, ("10.0.0.1",)),
    ]
    assert local_addresses(lambda: found) == [
        Address("lo", "127.0.0.1"),
        Address("eth0", "198.18.0.11"),
    ]


def test_gloo_takes_the_named_interface_or_says_it_is_missing():
    chosen = gloo_choice({"GLOO_SOCKET_IFNAME": "eth1,eth0"}, ADDRS)
    assert (chosen.addr, chosen.iface, chosen.error) == ("198.19.0.11", "eth1", None)
    missing = gloo_choice({"GLOO_SOCKET_IFNAME": "ens5"}, ADDRS)
    assert missing.addr is None and missing.error == "no interface ens5 with an address"


def test_gloo_uses_the_host_name_or_falls_back_to_loopback():
    named = gloo_choice({}, ADDRS, hostname="localhost")
    assert named.addr in ("127.0.0.1", "::1") and named.source == "host name localhost"
    nameless = gloo_choice({}, ADDRS, hostname="no-such-host.invalid")
    assert (nameless.addr, nameless.iface) == ("127.0.0.1", "lo")
    assert nameless.source == "loopback fallback: host name no-such-host.invalid does not resolve"


def test_a_connect_counts_only_when_the_expected_listener_answers():
    listener = Listener(token("run", 1))
    try:
        probe = connect_once("127.0.0.1", listener.port, token("run", 1), 2.0)
        assert probe.ok and probe.bulk and probe.error is None and probe.ms is not None
        other = connect_once("127.0.0.1", listener.port, token("run", 2), 2.0)
        assert not other.ok and other.error == "reached another host (it answers for someone else)"
    finally:
        listener.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    refused = connect_once("127.0.0.1", closed, token("run", 1), 2.0)
    assert (refused.ok, refused.error) == (False, "refused")


def test_probe_peers_tries_every_address_of_every_other_peer():
    listener = Listener(token("run", 1))
    try:
        peers = {
            0: {"port": 1, "addresses": [{"iface": "lo", "addr": "127.0.0.1"}]},  # me: skipped
            1: {
                "port": listener.port,
                "addresses": [{"iface": "lo", "addr": "127.0.0.1"}],
                "gloo": {"addr": "127.0.0.2", "iface": "lo"},  # on no interface: probed too
            },
        }
        probes = probe_peers(0, peers, "run", time.monotonic() + 5)
    finally:
        listener.close()
    assert [(p.src, p.dst, p.addr, p.ok) for p in probes] == [
        (0, 1, "127.0.0.1", True),
        (0, 1, "127.0.0.2", True),  # 0.0.0.0 listens on all of 127/8
    ]


def leader(host: str, n: int, gloo: dict, env: dict | None = None) -> dict:
    return {
        "host": host,
        "port": 40000 + n,
        "addresses": [
            {"iface": "lo", "addr": "127.0.0.1"},
            {"iface": "eth0", "addr": f"198.18.0.1{n}"},
            {"iface": "eth1", "addr": f"198.19.0.1{n}"},
        ],
        "gloo": gloo,
        "env": env or {},
    }


def lab_probes(gloo_addr: dict[int, str] | None = None, *, eth0: bool = True) -> list[Probe]:
    """What two lab hosts see: eth0 reaches the peer, eth1 and loopback do not."""
    probes = []
    for src, dst in ((0, 1), (1, 0)):
        n = dst + 1
        probes += [
            Probe(src, dst, "lo", "127.0.0.1", False, error="refused"),
            Probe(
                src,
                dst,
                "eth0",
                f"198.18.0.1{n}",
                eth0,
                0.3 if eth0 else None,
                None if eth0 else "no answer within 2 s",
            ),
            Probe(src, dst, "eth1", f"198.19.0.1{n}", False, error="no answer within 2 s"),
        ]
        extra = (gloo_addr or {}).get(dst)
        if extra:
            probes.append(Probe(src, dst, "lo", extra, False, error="refused"))
    return probes


def test_eth0_is_the_interface_that_reaches_every_node():
    infos = {
        r: leader(h, r + 1, {"addr": f"198.18.0.1{r + 1}", "iface": "eth0", "source": f"host name {h}"})
        for r, h in ((0, "h1"), (1, "h2"))
    }  # fmt: skip
    reach = Reach(infos, lab_probes())
    assert reach.common() == ["eth0"] and group_blocker(reach, NODES) is None
    result = judge_reach(reach, NODES)
    assert result.status.value == "pass"
    assert result.summary == (
        "eth0 reaches every node from every node; NCCL_SOCKET_IFNAME=eth0 / "
        "GLOO_SOCKET_IFNAME=eth0 work on all hosts"
    )


def test_host_names_on_127_0_1_1_block_the_group_and_the_fix_names_eth0_and_the_addresses():
    infos = {
        r: leader(h, r + 1, {"addr": "127.0.1.1", "iface": "lo", "source": f"host name {h}"})
        for r, h in ((0, "h1"), (1, "h2"))
    }
    reach = Reach(infos, lab_probes({0: "127.0.1.1", 1: "127.0.1.1"}))
    blocker = group_blocker(reach, NODES)
    assert blocker == (
        "gloo on node 0 (h1) listens on 127.0.1.1 (what host name h1 resolves to), which "
        "node 1 (h2) cannot reach: refused"
    )
    result = judge_reach(reach, NODES)
    assert result.status.value == "fail" and result.summary == blocker
    assert result.fix is not None
    assert result.fix.startswith("Set GLOO_SOCKET_IFNAME=eth0 and NCCL_SOCKET_IFNAME=eth0")
    assert "h1 198.18.0.11, h2 198.18.0.12" in result.fix


def test_nccl_ifname_naming_the_interface_that_reaches_no_peer_is_named():
    gloo = {"addr": "198.18.0.11", "iface": "eth0", "source": "host name h"}
    infos = {
        0: leader("h1", 1, gloo, {"NCCL_SOCKET_IFNAME": "eth1"}),
        1: leader("h2", 2, {**gloo, "addr": "198.18.0.12"}, {"NCCL_SOCKET_IFNAME": "eth1"}),
    }
    result = judge_reach(Reach(infos, lab_probes()), NODES)
    assert result.status.value == "fail"
    assert result.summary.startswith(
        "NCCL_SOCKET_IFNAME=eth1: eth1 of node 0 (h1) is not reached from node 1 (h2): no answer"
    )
    assert result.fix is not None and "NCCL_SOCKET_IFNAME=eth0" in result.fix


def test_no_interface_reaching_the_peer_points_at_a_firewall():
    infos = {
        r: leader(h, r + 1, {"addr": f"198.18.0.1{r + 1}", "iface": "eth0", "source": f"host name {h}"})
        for r, h in ((0, "h1"), (1, "h2"))
    }  # fmt: skip
    result = judge_reach(Reach(infos, lab_probes(eth0=False)), NODES)
    assert result.status.value == "fail" and result.facts["common"] == []
    assert result.fix is not None and "a firewall lets that port through" in result.fix
    assert "node 1 (h2) -> eth0 of node 0 (h1): no answer within 2 s" in result.details


def test_a_leader_without_results_is_not_taken_for_a_failure():
    infos = {
        r: leader(h, r + 1, {"addr": f"198.18.0.1{r + 1}", "iface": "eth0", "source": f"host name {h}"})
        for r, h in ((0, "h1"), (1, "h2"))
    }  # fmt: skip
    only_from_0 = [p for p in lab_probes(eth0=False) if p.src == 0]
    reach = Reach(infos, only_from_0, missing=(0,))
    assert group_blocker(reach, NODES) is None
