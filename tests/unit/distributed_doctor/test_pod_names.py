"""A pod's doctor (PET_*): the local checks read and name the variables the user set, and a
master name that resolves late is a pass once the join resolved it (recorded resolvers: no
query leaves the machine)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ddpdoctor.checks import network
from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.registry import select_checks
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_check_list
from ddpdoctor.distributed_doctor import names, rank_setup
from ddpdoctor.launchers.identity import detect_launch
from tests.unit.checks.test_checks_network import FakeNet

POD0 = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "PET_NNODES": "2",
    "PET_NODE_RANK": "0",
    "PET_MASTER_ADDR": "ddp-0.ddp",
    "PET_MASTER_PORT": "29500",
}


@dataclass
class LateNet(FakeNet):
    """ddp-0.ddp does not resolve until `appears` (a headless service's name)."""

    appears: float = field(default_factory=lambda: time.monotonic() + 3600)

    def resolve(self, host):
        if host == "ddp-0.ddp" and time.monotonic() >= self.appears:
            self.resolved = {**self.resolved, host: ("10.0.0.5",)}
        return super().resolve(host)


def _setup(env, net) -> rank_setup.Setup:
    info = detect_launch(env)
    context = CheckContext(
        env=names.checks_env(info, env), options=DoctorOptions(smoke=False), probes=Probes(net=net)
    )
    checks = select_checks(["network", "rendezvous"], smoke=False)
    return rank_setup.Setup(info, checks, context, 60.0, False, time.monotonic() + 60)


def test_the_pods_checks_read_pet_and_name_it_not_rank_or_master_addr():
    setup = _setup(POD0, FakeNet())
    assert "RANK" not in setup.context.env and "MASTER_ADDR" not in setup.context.env
    result = network.master_addr(setup.context)
    assert result.status is Status.FAIL
    assert result.summary.startswith("PET_MASTER_ADDR=ddp-0.ddp does not resolve"), result.summary
    port = network.master_port(setup.context)
    assert port.status is Status.PASS and "this host (the master)" in port.summary  # node 0


def test_the_port_check_of_a_pod_does_not_look_the_master_up():
    net = FakeNet()
    network.master_port(_setup({**POD0, "PET_NODE_RANK": "1"}, net).context)
    assert not [c for c in net.calls if c.startswith("resolve")], net.calls


def test_a_name_check_that_looked_too_early_looks_again_once_the_name_resolved():
    net = LateNet()
    setup = _setup(POD0, net)
    results = run_check_list(setup.checks, setup.context)
    early = DoctorReport.build(results)
    assert early.by_id("network.master_addr").status is Status.FAIL
    # the join resolved the name 4.2 s later: node 0's report says pass, and how long it took
    net.appears = time.monotonic()
    later = names.recheck_names(setup, early, 4.2)
    check = later.by_id("network.master_addr")
    assert check.status is Status.PASS, check.summary
    assert "did not resolve for 4.2 s at first" in check.details[-1]
    assert later.exit_code == 0 and [r.id for r in later.results] == [r.id for r in early.results]


def test_a_name_check_that_failed_for_another_reason_is_left_as_it_was():
    net = FakeNet(resolved={"ddp-0.ddp": ("127.0.0.1",), "node1": ("10.0.0.5",)})
    setup = _setup(POD0, net)
    report = DoctorReport.build(run_check_list(setup.checks, setup.context))
    bad = report.by_id("network.master_addr")
    assert bad.status is Status.FAIL and "loopback" in bad.summary
    assert names.recheck_names(setup, report, None) is report
