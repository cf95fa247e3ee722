"""A hang no rank causes, produced for real between two hosts of the lab (make lab): the link
between them cut (iptables DROP both ways, and one way), one host's interface taken down, and
one host's /etc/hosts changed mid-run; and a healthy two-host job beside them.

Each job runs over a link of its own: a veth pair between h1 and h2 made for it (`ddnK`,
198.19.7K.11/.12), with the jobs' own /etc/hosts naming h1 and h2 on it. The faults touch only
that link (iptables rules on `-i ddnK` / `-o ddnK`, the interface's state) or that file, so the
other users of the lab and its hosts' own interfaces see nothing; teardown deletes the links and
the rules with them. All five jobs run at once (about 90 s on a busy 2-core machine).
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
from tests.procs import Finished, background, clean_env, ddpdoctor_cmd, free_port, job_processes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(500),
]

HANG_AFTER_S = 5
WITHIN_S = 15  # a network hang is named within this long past the hang threshold
LAUNCH_TIMEOUT_S = 300
FAULT_AT_STEP = 12


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=30, capture_output=True)


def _netns(host: str) -> str:
    return f"{lab.PREFIX}-{host}"


@dataclass
class Job:
    name: str
    index: int  # its link: ddn<index>, 198.19.7<index>.0/24
    fault: str | None
    steps: int = 2000
    run_dir: Path = Path()
    tmp: Path = Path()
    nodes: list[Finished] = field(default_factory=list)
    fault_t: float | None = None
    undo: list[list[str]] = field(default_factory=list)

    @property
    def iface(self) -> str:
        return f"ddn{self.index}"

    def addr(self, host: str) -> str:
        return f"198.19.7{self.index}.{10 + int(host.lstrip('h'))}"

    @property
    def diagnosis(self) -> dict:
        return json.loads((self.run_dir / "diagnosis.json").read_text())

    def finding(self, fid: str) -> dict:
        found = [f for f in self.diagnosis["findings"] if f["id"] == fid]
        assert found, self.explain()
        return found[0]

    def explain(self) -> str:
        return "\n".join(f"--- {h}\n{n.stdout[-4000:]}\n{n.stderr[-1500:]}"
                         for h, n in zip(("h1", "h2"), self.nodes, strict=False))  # fmt: skip


def make_link(job: Job) -> None:
    """A veth pair between h1 and h2 named ddnK on both sides, addressed and up."""
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("-n", _netns("h1"), "link", "del", job.iface)  # a leftover of an interrupted run
    a, b = f"{job.iface}-a", f"{job.iface}-b"
    _ip("link", "add", a, "type", "veth", "peer", "name", b)
    for host, end in (("h1", a), ("h2", b)):
        _ip("link", "set", end, "netns", _netns(host))
        _ip("-n", _netns(host), "link", "set", end, "name", job.iface)
        _ip("-n", _netns(host), "addr", "add", f"{job.addr(host)}/24", "dev", job.iface)
        _ip("-n", _netns(host), "link", "set", job.iface, "up")


def drop_link(job: Job) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("-n", _netns("h1"), "link", "del", job.iface)  # both ends, and every rule on it


def hosts_file(job: Job, host: str) -> Path:
    return job.tmp / f"{job.name}.{host}.hosts"


def write_hosts(job: Job, host: str, h1: str | None = None) -> None:
    """`host`'s /etc/hosts in the job; written in place, since it is bind-mounted into the job."""
    path = hosts_file(job, host)
    text = f"127.0.0.1 localhost\n{h1 or job.addr('h1')} h1\n{job.addr('h2')} h2\n"
    with open(path, "r+" if path.exists() else "w") as fh:
        fh.seek(0)
        fh.write(text)
        fh.truncate()


def apply_fault(job: Job) -> None:
    if job.fault in ("cut-both", "cut-one-way"):
        rules = [["INPUT", "-i", job.iface, "-j", "DROP"]]
        if job.fault == "cut-both":
            rules.append(["OUTPUT", "-o", job.iface, "-j", "DROP"])
        lab.iptables_together("h1", rules)  # both ways at once, or one way for a moment
        job.undo.extend(["-D", *rule] for rule in rules)
    elif job.fault == "interface-down":
        _ip("-n", _netns("h2"), "link", "set", job.iface, "down")
    elif job.fault == "hosts-changed":
        write_hosts(job, "h2", h1=f"198.19.7{job.index}.99")  # h2's alone
    job.fault_t = time.time()


def undo_fault(job: Job) -> None:
    for rule in job.undo:
        with contextlib.suppress(subprocess.CalledProcessError):
            lab.iptables("h1", *rule)
    job.undo.clear()


def steps_done(job: Job) -> int:
    try:
        text = (job.run_dir / "events" / "rank-1.jsonl").read_text()
    except OSError:
        return 0
    return text.count('"kind":"step"')


def launch(job: Job, cache: Path) -> None:
    endpoint = f"h1:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache)})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--run-dir", str(job.run_dir), "--nproc", "1",
        "--steps", str(job.steps), "--hang-after", str(HANG_AFTER_S),
    ]  # fmt: skip
    cmds = [
        lab.on_host(
            host, ddpdoctor_cmd(*common, "--node-rank", str(node)), hosts_file=hosts_file(job, host)
        )
        for node, host in enumerate(("h1", "h2"))
    ]
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd in cmds]
        try:
            if job.fault is not None:
                while steps_done(job) < FAULT_AT_STEP and time.monotonic() < deadline:
                    if any(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.5)
                apply_fault(job)
            for proc in procs:
                try:
                    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    out, err = "", f"launcher still running after {LAUNCH_TIMEOUT_S} s"
                job.nodes.append(Finished(proc.returncode, out, err, 0.0))
                # kept beside the run, for reading after the test (docs/network-hangs.md)
                host = f"h{len(job.nodes)}"
                (job.tmp / f"{job.name}.{host}.out").write_text(out + err)
        finally:
            undo_fault(job)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Job]:
    tmp = tmp_path_factory.mktemp("lab-net")
    cache = tmp / "cache"
    specs = [
        Job("healthy", 1, None, steps=40),
        Job("cut-both", 2, "cut-both"),
        Job("cut-one-way", 3, "cut-one-way"),
        Job("interface-down", 4, "interface-down"),
        Job("hosts-changed", 5, "hosts-changed", steps=110),
    ]
    made: list[Job] = []
    try:
        for job in specs:
            job.run_dir = tmp / job.name
            job.tmp = tmp
            write_hosts(job, "h1")
            write_hosts(job, "h2")
            make_link(job)
            made.append(job)
        threads = [threading.Thread(target=launch, args=(j, cache)) for j in specs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for job in made:
            undo_fault(job)
            drop_link(job)
    return {job.name: job for job in specs}


def _detected_in_time(job: Job) -> None:
    diagnosis = job.diagnosis
    assert diagnosis["detected_after_s"] is not None, job.explain()
    assert diagnosis["detected_after_s"] <= HANG_AFTER_S + WITHIN_S, job.explain()


@pytest.mark.parametrize("name", ["cut-both", "cut-one-way", "interface-down"])
def test_a_cut_link_is_a_network_hang_and_the_job_is_stopped(jobs, name):
    job = jobs[name]
    diagnosis = job.diagnosis
    assert diagnosis["verdict"] == "hang" and diagnosis["culprits"] == [], job.explain()
    assert [n.returncode for n in job.nodes] == [1, 1], job.explain()
    _detected_in_time(job)
    assert job_processes(job.run_dir) == []
    assert "network.link" in job.nodes[0].stdout  # node 0's launcher says it


def test_both_ways_cut_names_the_pair_and_the_dead_connection(jobs):
    job = jobs["cut-both"]
    summary = job.finding("network.link")["summary"]
    assert "the link between h1 and h2 carries nothing in either direction" in summary, summary
    assert "queued on rank" in summary and "retransmits" in summary and "no ACK for" in summary
    assert (
        "a probe from h1 to h2 times out" in summary or "a probe from h2 to h1 times out" in summary
    )


def test_one_way_cut_names_the_direction(jobs):
    job = jobs["cut-one-way"]
    summary = job.finding("network.link")["summary"]
    # h1 drops what comes in from h2: h2 -> h1 is dead, h1 -> h2 still delivers. h1 -> h2 is
    # named as carrying only when h1 had segments in flight that arrived during the stall; h1
    # waiting for h2's data sends nothing, and then the pair is named, never a wrong direction
    one_way = "the link h2 → h1 carries nothing (h1 → h2 does)"
    pair = "the link between h1 and h2 carries nothing in either direction"
    assert one_way in summary or pair in summary, summary
    evidence = " ".join(e["text"] for e in job.finding("network.link")["evidence"])
    assert "segments h2 sent on the job's connections never reached h1" in evidence


def test_an_interface_taken_down_is_named_with_its_host(jobs):
    job = jobs["interface-down"]
    summary = job.finding("network.link")["summary"]
    assert f"h2's {job.iface} ({job.addr('h2')}) is down" in summary, summary
    assert "→" not in summary  # no direction claimed from counters the kernel stopped


def test_a_name_changed_mid_run_is_named_before_and_after_and_the_job_is_not_stopped(jobs):
    job = jobs["hosts-changed"]
    diagnosis = job.diagnosis
    assert diagnosis["verdict"] == "healthy", job.explain()
    assert [n.returncode for n in job.nodes] == [0, 0], job.explain()
    changed = [f for f in diagnosis["findings"] if f["id"] == "network.name_changed"]
    assert len(changed) == 1 and changed[0]["severity"] == "warning", job.explain()
    summary = changed[0]["summary"]
    assert (
        f"on h2, rendezvous endpoint h1 resolved to {job.addr('h1')} when the job started; "
        f"now to 198.19.7{job.index}.99"
    ) in summary, summary


def test_a_healthy_two_host_job_gets_no_network_finding_and_no_look(jobs):
    job = jobs["healthy"]
    diagnosis = job.diagnosis
    assert diagnosis["verdict"] == "healthy", job.explain()
    assert [n.returncode for n in job.nodes] == [0, 0], job.explain()
    assert not [f for f in diagnosis["findings"] if f["id"].startswith("network.")]
    # the ranks never all stalled: no launcher looked at the sockets or probed a peer
    assert not list((job.run_dir / "nodes").glob("node-*/network.json"))
