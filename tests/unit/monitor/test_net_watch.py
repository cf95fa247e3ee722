"""The launcher's network side: a look only once every rank of its node stalled, removed once
they progress; node 0 reads the looks back; and, for a launch where no rank starts, the names
it needs."""

from __future__ import annotations

import os
import socket
import time

from ddpdoctor.monitor.follow import net_watch, startup_names
from ddpdoctor.monitor.follow.net_watch import NetReports, NetWatch, network_path, read_report
from ddpdoctor.monitor.model.snapshot import RankState
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_builders import view


def _views(state: RankState, progress_t: float):
    return [view(0, state, pid=os.getpid(), last_progress_t=progress_t)]


def test_a_running_node_is_never_looked_at(tmp_path):
    run = RunDir.create(tmp_path / "run")
    watch = NetWatch(run, 1, host="h2")
    now = time.time()
    for i in range(50):
        watch.observe(_views(RankState.RUNNING, now + i), {0: os.getpid()}, now + i, 5.0)
    watch.wait(5)
    assert watch.looks == 0 and not network_path(run, 1).exists()


def test_a_stalled_node_is_looked_at_and_the_look_goes_once_it_progresses(tmp_path):
    run = RunDir.create(tmp_path / "run")
    watch = NetWatch(run, 1, names=[("localhost", "MASTER_ADDR")], host="h2")
    now = time.time()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        watch.observe(_views(RankState.STALLED, now - 2), {0: os.getpid()}, now, 5.0)
        watch.wait(5)
        assert watch.looks == 0  # 2 s without progress: below the threshold
        watch.observe(_views(RankState.STALLED, now - 9), {0: os.getpid()}, now, 5.0)
        watch.wait(10)
    assert watch.looks == 1
    report = read_report(network_path(run, 1))
    assert report is not None and report.host == "h2" and report.stalled_s >= 9
    assert all(link.peer != "127.0.0.1" for link in report.links)  # loopback is no link
    assert report.names[0].name == "localhost" and report.names[0].now
    assert NetReports(run).read([0, 1]) == (report,)
    watch.observe(_views(RankState.RUNNING, now + 1), {0: os.getpid()}, now + 1, 5.0)
    watch.wait(5)
    assert not network_path(run, 1).exists()


def test_a_report_that_is_not_a_regular_file_is_not_read(tmp_path):
    run = RunDir.create(tmp_path / "run")
    path = network_path(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    assert read_report(path) is None  # (a FIFO would block an open() without O_NONBLOCK)


def test_job_names_leave_addresses_out():
    names = net_watch.job_names(
        {"torchrun": ["torchrun", "--rdzv-endpoint", "master-0.job:29400"]},
        {"MASTER_ADDR": "10.0.0.5"},
    )
    assert names[0] == ("master-0.job", "rendezvous endpoint")
    assert all(name != "10.0.0.5" for name, _ in names)
    assert names[-1] == (socket.gethostname(), "this host's name")


def test_a_name_that_does_not_resolve_is_said_once_no_rank_started_after_a_while(monkeypatch):
    monkeypatch.setattr(
        startup_names, "resolve", lambda name: ((), "Name or service not known", 0.01)
    )
    check = startup_names.StartupNames([("h1", "this host's name")])
    check.observe(True, 3.0)
    assert check.findings(True) == []  # too early
    check.observe(True, 9.0)
    check._thread.join(5)
    found = check.findings(True)
    assert [f.id for f in found] == ["network.name_unresolved"]
    assert "this host's name h1 does not resolve (Name or service not known" in found[0].summary
    assert check.findings(False) == []  # a rank started: nothing to explain


def test_names_that_resolve_say_nothing(monkeypatch):
    monkeypatch.setattr(startup_names, "resolve", lambda name: (("10.0.0.1",), None, 0.01))
    check = startup_names.StartupNames([("h1", "this host's name")])
    check.observe(True, 9.0)
    check._thread.join(5)
    assert check.findings(True) == []
