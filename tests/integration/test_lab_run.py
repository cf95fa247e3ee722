"""`ddpdoctor run` across two hosts of the lab (make lab): one launcher per host, c10d rendezvous
at h1's eth0 address, the run directory shared (as on NFS), each host with its own pids.

A hang, a crash, a collective mismatch and a host whose launcher never starts, all at once: the
culprit and its host are named, every launcher exits, and nothing is left running.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import lab
from tests.procs import Finished, background, clean_env, ddpdoctor_cmd, free_port, job_processes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(400),
]

LAUNCH_TIMEOUT_S = 240


@dataclass
class LabRun:
    run_dir: Path
    extra: tuple[str, ...]
    hosts: tuple[str, ...] = ("h1", "h2")
    nodes: list[Finished] = field(default_factory=list)

    def explain(self) -> str:
        return "\n".join(f"--- {h}\n{n.stdout[-3000:]}\n{n.stderr[-1500:]}"
                         for h, n in zip(self.hosts, self.nodes, strict=False))  # fmt: skip

    @property
    def diagnosis(self) -> dict:
        return json.loads((self.run_dir / "diagnosis.json").read_text())


def launch(run: LabRun, cache: Path) -> None:
    endpoint = f"{lab.address('h1')}:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache)})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--run-dir", str(run.run_dir), "--nproc", "1", *run.extra,
    ]  # fmt: skip
    cmds = [
        lab.on_host(host, ddpdoctor_cmd(*common, "--node-rank", str(node)))
        for node, host in enumerate(run.hosts)
    ]
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd in cmds]
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                out, err = "", f"launcher still running after {LAUNCH_TIMEOUT_S} s"
            run.nodes.append(Finished(proc.returncode, out, err, 0.0))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, LabRun]:
    tmp = tmp_path_factory.mktemp("lab-run")
    cache = tmp / "cache"
    specs = {
        "hang": LabRun(
            tmp / "hang", ("--steps", "30", "--inject", "hang:rank=1,step=3", "--hang-after", "2")
        ),
        "crash": LabRun(tmp / "crash", ("--steps", "30", "--inject", "crash:rank=1,step=3")),
        "mismatch": LabRun(
            tmp / "mismatch",
            ("--steps", "30", "--inject", "mismatch:rank=1,step=3", "--hang-after", "2"),
        ),
        "never-starts": LabRun(tmp / "never", ("--join-timeout", "6"), hosts=("h1",)),
    }
    threads = [threading.Thread(target=launch, args=(r, cache)) for r in specs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return specs


@pytest.mark.parametrize("name", ["hang", "crash", "mismatch", "never-starts"])
def test_every_launcher_exits_1_and_nothing_is_left_running(runs, name):
    run = runs[name]
    assert [n.returncode for n in run.nodes] == [1] * len(run.hosts), run.explain()
    assert job_processes(run.run_dir) == []


def test_the_hung_rank_and_its_host_are_named_with_its_stack(runs):
    run = runs["hang"]
    lead = run.nodes[0].stdout
    assert "HANG: culprit rank 1" in lead, run.explain()
    culprit_line = next(line for line in lead.splitlines() if line.strip().startswith("rank 1 "))
    assert "h2:" in culprit_line and "_inject_hang" in culprit_line
    # rank 1 lives in h2's pid namespace: only h2's launcher could take its stack
    assert "waiting for rank(s) 1 from node 1" in lead
    stacks = run.diagnosis["stacks"]
    frames = next(g["frames"] for g in stacks if 1 in g["ranks"])
    assert any("_inject_hang" in f for f in frames)
    # the verdict the job was stopped for stays the final one: rank 0's all-reduce failing once
    # h2 stopped rank 1 is a consequence of the stop, never a crash of its own
    diagnosis = run.diagnosis
    assert diagnosis["verdict"] == "hang" and diagnosis["culprits"] == [1], run.explain()
    assert diagnosis["stopped_for"] == {"verdict": "hang", "culprits": [1]}


def test_the_crashed_rank_and_its_host_are_named(runs):
    run = runs["crash"]
    diagnosis = run.diagnosis
    assert diagnosis["verdict"] == "crash" and diagnosis["culprits"] == [1], run.explain()
    ranks = {r["rank"]: r for r in diagnosis["ranks"]}
    assert ranks[1]["host"] == "h2" and ranks[0]["host"] == "h1"
    for node in run.nodes:
        assert "verdict: crash (exit code 1)" in node.stdout


def test_the_mismatched_rank_is_named(runs):
    run = runs["mismatch"]
    diagnosis = run.diagnosis
    assert diagnosis["verdict"] in ("mismatch", "crash", "hang"), run.explain()
    assert 1 in diagnosis["culprits"]
    summaries = " ".join(f["summary"] for f in diagnosis["findings"])
    assert "mismatch" in summaries.lower(), summaries


def test_a_host_whose_launcher_never_starts_is_named(runs):
    run = runs["never-starts"]
    said = run.nodes[0].stdout + run.nodes[0].stderr
    assert "NOT STARTED: node 1 never joined the rendezvous" in said, run.explain()
    assert "verdict: not started (exit code 1)" in said
