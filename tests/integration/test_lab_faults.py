"""`doctor --distributed` on two hosts of the lab (make lab), with the network faults users hit
produced for real: each report must name the cause and the fix, and come within --timeout + 5 s.

The faults that touch only one job (its /etc/hosts, its environment, a rule for its own port) run
at once, each on its own MASTER_PORT; the firewall that closes every port but MASTER_PORT runs
alone after them, since it would break the others.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import lab
from tests.procs import PYTHON, Finished, background, clean_env, ddpdoctor_cmd, free_port, run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(400),
]

T = 8  # --timeout for every scenario
BOUND_S = T + 5  # what the report may take, counted from when ddpdoctor has loaded torch
# Starting Python and importing torch is not ddpdoctor waiting; on a busy 2-core machine it can
# take tens of seconds, so the wall clock gets that much more (still far below gloo's own waits).
STARTUP_S = 60
SCENARIOS_AT_ONCE = 3


@dataclass
class Rank:
    host: str
    env: dict[str, str] = field(default_factory=dict)
    hosts_file: Path | None = None


@dataclass
class Scenario:
    ranks: list[Rank]
    world: int = 2
    port: int = 0
    torchrun: bool = False  # one torchrun agent per host (c10d rendezvous at h1) instead of RANK=
    results: list[Finished] = field(default_factory=list)

    @property
    def report(self) -> dict:
        """Rank 0's report (under torchrun: from whichever agent started rank 0)."""
        printed = [r for r in self.results if r.stdout.strip()]
        assert len(printed) == 1, self.explain()
        return json.loads(printed[0].stdout)

    def result(self, check_id: str) -> dict:
        return next(r for r in self.report["results"] if r["id"] == check_id)

    def explain(self) -> str:
        return "\n".join(f"--- rank {i}: {r.stdout[-3000:]}\n{r.stderr[-2000:]}"
                         for i, r in enumerate(self.results))  # fmt: skip


def run_scenario(scenario: Scenario) -> None:
    """Start every rank of the scenario on its host at once; wait for all (bounded)."""
    master = lab.address("h1")
    commands = []
    for rank, spec in enumerate(scenario.ranks):
        env = clean_env(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(scenario.world),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(scenario.port),
                **spec.env,
            }
        )
        cmd = ddpdoctor_cmd("doctor", "--distributed", "--json", "--timeout", str(T))
        if scenario.torchrun:
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(name)
            cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(scenario.world),
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"{master}:{scenario.port}", "--rdzv-id", "lab", "--max-restarts", "0",
                   *cmd[1:]]  # fmt: skip
        commands.append((lab.on_host(spec.host, cmd, hosts_file=spec.hosts_file), env))
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd, env in commands]
        for proc in procs:
            left = max(0.1, BOUND_S + STARTUP_S - (time.monotonic() - start))
            try:
                out, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                out, err = "", f"still running after {BOUND_S + STARTUP_S} s"
            scenario.results.append(Finished(proc.returncode, out, err, time.monotonic() - start))


def hosts_file(tmp: Path, name: str, lines: list[str]) -> Path:
    path = tmp / name
    path.write_text("\n".join(["127.0.0.1 localhost", *lines]) + "\n")
    return path


# The two scenarios that change both hosts run alone, after the others: only when a selected test
# reads them (the slow tier's: tests/integration/conftest.py).
ALONE = {"data-ports-firewalled": "firewall", "jumbo-mtu": "mtu"}


def _wanted_alone(session: pytest.Session) -> set[str]:
    here = [item for item in session.items if Path(str(item.path)).name == Path(__file__).name]
    return {
        name
        for name, word in ALONE.items()
        if any(name in item.nodeid or f"_{word}_" in item.name for item in here)
    }


@pytest.fixture(scope="module")
def faults(request, tmp_path_factory) -> dict[str, Scenario]:
    tmp = tmp_path_factory.mktemp("lab")
    nameless = hosts_file(tmp, "nameless", [])
    loopback = hosts_file(tmp, "loopback", ["127.0.1.1 h1", "127.0.1.1 h2"])
    right = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    scenarios = {
        "healthy": Scenario([Rank("h1"), Rank("h2")]),
        "right-interface": Scenario([Rank("h1", right), Rank("h2", right)]),
        "unresolvable": Scenario([Rank("h1", hosts_file=nameless), Rank("h2", hosts_file=nameless)]),
        "loopback-name": Scenario([Rank("h1", hosts_file=loopback), Rank("h2", hosts_file=loopback)]),
        "localhost-master": Scenario([Rank("h1"), Rank("h2", {"MASTER_ADDR": "localhost"})]),
        "master-port-firewalled": Scenario([Rank("h1"), Rank("h2")]),
        "interface-reaches-no-peer": Scenario(
            [Rank("h1", {"GLOO_SOCKET_IFNAME": "eth1"}), Rank("h2", {"GLOO_SOCKET_IFNAME": "eth1"})]
        ),
        "interface-missing-on-one-host": Scenario(
            [Rank("h1", {"GLOO_SOCKET_IFNAME": "eth0"}), Rank("h2", {"GLOO_SOCKET_IFNAME": "ens5"})]
        ),
        "host-never-joins": Scenario([Rank("h1")]),
        "torchrun-interface-reaches-no-peer": Scenario(
            [Rank("h1", {"GLOO_SOCKET_IFNAME": "eth1"}), Rank("h2", {"GLOO_SOCKET_IFNAME": "eth1"})],
            torchrun=True,
        ),
    }  # fmt: skip
    for scenario in scenarios.values():
        scenario.port = free_port()
    port = scenarios["master-port-firewalled"].port
    rule = ("INPUT", "-i", "eth0", "-p", "tcp", "--dport", str(port), "-j", "DROP")
    lab.iptables("h1", "-A", *rule)
    try:
        # A few scenarios at a time: twenty processes importing torch at once on two cores take
        # longer to start than STARTUP_S allows (each scenario's clock starts with its own ranks).
        slots = threading.Semaphore(SCENARIOS_AT_ONCE)

        def run_in_a_slot(scenario: Scenario) -> None:
            with slots:
                run_scenario(scenario)

        threads = [threading.Thread(target=run_in_a_slot, args=(s,)) for s in scenarios.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        lab.iptables("h1", "-D", *rule)
    wanted = _wanted_alone(request.session)
    if "data-ports-firewalled" in wanted:
        scenarios["data-ports-firewalled"] = data_ports_firewalled()
    if "jumbo-mtu" in wanted:
        scenarios["jumbo-mtu"] = jumbo_mtu()
    return scenarios


def data_ports_firewalled() -> Scenario:
    """Both hosts let in only MASTER_PORT (and replies): the rendezvous works, gloo cannot."""
    scenario = Scenario([Rank("h1"), Rank("h2")], port=free_port())
    common = ("-i", "eth0", "-p", "tcp")
    for host in ("h1", "h2"):
        lab.iptables(host, "-A", "INPUT", *common, "--dport", str(scenario.port), "-j", "ACCEPT")
        lab.iptables(host, "-A", "INPUT", *common, "-m", "state", "--state",
                     "ESTABLISHED,RELATED", "-j", "ACCEPT")  # fmt: skip
        lab.iptables(host, "-A", "INPUT", *common, "-j", "DROP")
    try:
        run_scenario(scenario)
    finally:
        for host in ("h1", "h2"):
            lab.clear_firewall(host)
    return scenario


def jumbo_mtu() -> Scenario:
    """Both hosts at MTU 9000 on a switch that carries 1500: connects work, gloo stalls."""
    scenario = Scenario([Rank("h1"), Rank("h2")], port=free_port())
    for host in ("h1", "h2"):
        lab.set_mtu(host, 9000)
    try:
        run_scenario(scenario)
    finally:
        for host in ("h1", "h2"):
            lab.set_mtu(host, 1500)
    return scenario


ALL = [
    "healthy", "right-interface", "unresolvable", "loopback-name", "localhost-master",
    "master-port-firewalled", "interface-reaches-no-peer", "interface-missing-on-one-host",
    "host-never-joins", "data-ports-firewalled", "jumbo-mtu", "torchrun-interface-reaches-no-peer",
]  # fmt: skip


@pytest.mark.parametrize("name", ALL)
def test_every_rank_ends_and_the_report_comes_within_the_timeout(faults, name):
    scenario = faults[name]
    for finished in scenario.results:
        assert finished.returncode is not None and finished.elapsed_s < BOUND_S + STARTUP_S, (
            scenario.explain()
        )
    assert scenario.report["elapsed_s"] <= BOUND_S, scenario.explain()
    codes = {r.returncode for r in scenario.results}
    assert codes == {scenario.report["exit_code"]}, scenario.explain()


@pytest.mark.parametrize("name", ["healthy", "right-interface"])
def test_a_healthy_network_is_not_flagged_and_eth0_is_named(faults, name):
    scenario = faults[name]
    report = scenario.report
    assert report["exit_code"] == 0, scenario.explain()
    cluster = [r for r in report["results"] if r["group"] == "cluster"]
    assert [r["id"] for r in cluster if r["status"] in ("warn", "fail")] == []
    reached = scenario.result("cluster.ifname")
    assert reached["facts"]["common"] == ["eth0"]  # eth1 reaches no peer
    assert (
        "NCCL_SOCKET_IFNAME=eth0 / GLOO_SOCKET_IFNAME=eth0 work on all hosts"
        in (reached["summary"])
    )
    assert scenario.report["cluster"]["links"][0]["error"] is None


def assert_group_fails_with(scenario: Scenario, cause: str, fix: str) -> None:
    group = scenario.result("cluster.group")
    assert group["status"] == "fail", scenario.explain()
    assert cause in group["summary"], group
    assert fix in group["fix"], group
    assert scenario.result("cluster.ifname")["status"] == "fail"


def test_unresolvable_host_names_name_the_loopback_fallback_and_eth0(faults):
    assert_group_fails_with(
        faults["unresolvable"],
        "listens on 127.0.0.1 (loopback fallback: host name h1 does not resolve)",
        "GLOO_SOCKET_IFNAME=eth0 and NCCL_SOCKET_IFNAME=eth0",
    )
    assert "h1 198.18.0.11, h2 198.18.0.12" in faults["unresolvable"].result("cluster.group")["fix"]


def test_host_names_on_127_0_1_1_are_named(faults):
    assert_group_fails_with(
        faults["loopback-name"],
        "gloo on node 0 (h1) listens on 127.0.1.1 (what host name h1 resolves to)",
        "GLOO_SOCKET_IFNAME=eth0",
    )


@pytest.mark.parametrize(
    "name", ["interface-reaches-no-peer", "torchrun-interface-reaches-no-peer"]
)
def test_an_interface_that_reaches_no_peer_is_named_with_the_one_that_does(faults, name):
    scenario = faults[name]
    # torchrun's c10d rendezvous may give node 0 to either host
    first, second = [n["host"] for n in sorted(scenario.report["cluster"]["nodes"],
                                               key=lambda n: n["node"])]  # fmt: skip
    assert_group_fails_with(scenario, f"(GLOO_SOCKET_IFNAME=eth1), which node 1 ({second}) "
                            "cannot reach", "Set GLOO_SOCKET_IFNAME=eth0")  # fmt: skip
    summary = scenario.result("cluster.ifname")["summary"]
    assert (f"GLOO_SOCKET_IFNAME=eth1: eth1 of node 0 ({first}) is not reached from "
            f"node 1 ({second})") in summary  # fmt: skip


def test_an_interface_missing_on_one_host_is_named(faults):
    scenario = faults["interface-missing-on-one-host"]
    assert_group_fails_with(scenario, "GLOO_SOCKET_IFNAME=ens5 on node 1 (h2): no interface ens5",
                            "GLOO_SOCKET_IFNAME=eth0")  # fmt: skip
    summary = scenario.result("cluster.ifname")["summary"]
    assert "GLOO_SOCKET_IFNAME=ens5 names no interface of node 1 (h2)" in summary


def test_a_firewall_that_lets_only_master_port_through_is_named(faults):
    scenario = faults["data-ports-firewalled"]
    assert scenario.result("cluster.join")["status"] == "pass", scenario.explain()
    assert_group_fails_with(scenario, "which node 1 (h2) cannot reach: no answer within",
                            "a firewall lets that port through but not the random high ports")  # fmt: skip


@pytest.mark.parametrize("name", ["localhost-master", "master-port-firewalled", "host-never-joins"])
def test_a_rank_that_cannot_join_is_named_by_rank_0(faults, name):
    scenario = faults[name]
    joined = scenario.result("cluster.join")
    assert joined["status"] == "fail", scenario.explain()
    assert joined["summary"].startswith("rank 1 never joined"), joined
    assert joined["facts"]["missing_ranks"] == [1]


def test_localhost_on_a_non_master_host_is_named_there(faults):
    said = faults["localhost-master"].results[1].stderr
    assert "localhost is this host itself" in said, said[-2000:]
    assert "must be rank 0's node address" in said


def test_a_firewalled_master_port_is_named_on_the_host_that_cannot_reach_it(faults):
    scenario = faults["master-port-firewalled"]
    said = scenario.results[1].stderr
    assert f"nothing answered at MASTER_ADDR:MASTER_PORT 198.18.0.11:{scenario.port}" in said


def test_an_mtu_black_hole_is_named_with_the_mtus(faults):
    scenario = faults["jumbo-mtu"]
    assert_group_fails_with(scenario, "which node 1 (h2) cannot use: connects, but 64 KiB sent back",
                            "an interface MTU is larger than what the network between the nodes "
                            "carries (h1 eth0 9000, h2 eth0 9000)")  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ([], "this host's name 'h2' does not resolve"),
        (["127.0.1.1 h1", "127.0.1.1 h2"], "h2 resolves to 127.0.1.1 (loopback)"),
    ],
)
def test_doctor_on_one_host_fails_a_host_name_other_hosts_cannot_use(tmp_path, lines, needle):
    """No peer needed: MASTER_ADDR on another machine says the job spans hosts."""
    env = clean_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": lab.address("h1")})
    cmd = ddpdoctor_cmd("doctor", "--json", "--no-smoke", "network.hostname")
    hosts = hosts_file(tmp_path, "hosts", lines)
    result = run(lab.on_host("h2", cmd, hosts_file=hosts), env=env, timeout=120)
    (check,) = json.loads(result.stdout)["results"]
    assert check["status"] == "fail" and needle in check["summary"], check
    assert "GLOO_SOCKET_IFNAME=eth0" in check["fix"]
