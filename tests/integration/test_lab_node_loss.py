"""A lost host and a killed launcher, for real in the lab (make lab): `ddpdoctor run --nnodes 2`
on h1 and h2, the reference job training, then

- every process of the job on h2 (its launcher, its reaper, torchrun and the rank) SIGKILLed at
  once: h2 is named lost, with when it was last heard from; its rank is the culprit and h1's rank
  (a gloo peer reset) the consequence;
- h2's launcher alone SIGKILLed: its reaper ends h2's part and says so in its node record; h1's
  launcher tells that (interrupted, exit 130), never "rank N stopped from outside";
- a healthy two-host job beside them: healthy on both, no finding about a node.

The three run at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests import lab
from tests.procs import Finished, background, clean_env, ddpdoctor_cmd, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(420),
]

LAUNCH_TIMEOUT_S = 300
TRAINING_STEPS = 4  # steps of every rank before the fault


@dataclass
class LabRun:
    run_dir: Path
    fault: str | None  # "host", "launcher" or None
    steps: int = 2000
    nodes: list[Finished] = field(default_factory=list)
    fault_t: float | None = None

    def explain(self) -> str:
        return "\n".join(f"--- node {i}\n{n.stdout[-3000:]}\n{n.stderr[-1500:]}"
                         for i, n in enumerate(self.nodes))  # fmt: skip

    @property
    def diagnosis(self) -> dict:
        return json.loads((self.run_dir / "diagnosis.json").read_text())


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _processes_on(host: str, run_dir: Path) -> list[psutil.Process]:
    """Every process of this run on the lab host: those whose command line or environment
    names the run directory, in the host's pid namespace."""
    ns = _pid_ns(lab._pid(host) or -1)
    target = str(run_dir)
    found = []
    for proc in psutil.process_iter():
        try:
            if _pid_ns(proc.pid) != ns or proc.pid == lab._pid(host):
                continue
            words = proc.cmdline()
            if any(target in w for w in words) or target in proc.environ().get(
                "DDPDOCTOR_RUN_DIR", ""
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _training(run_dir: Path) -> bool:
    counts = []
    for path in (run_dir / "events").glob("rank-*.jsonl"):
        with contextlib.suppress(OSError):
            counts.append(path.read_text(errors="replace").count('"kind":"step"'))
    return len(counts) == 2 and min(counts) >= TRAINING_STEPS


def _fault(run: LabRun) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S - 60
    while not _training(run.run_dir):
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)
    procs = _processes_on("h2", run.run_dir)
    if run.fault == "launcher":
        procs = [p for p in procs if "ddpdoctor" in " ".join(p.cmdline()) and "run" in p.cmdline()
                 and "reaper" not in " ".join(p.cmdline())]  # fmt: skip
    run.fault_t = time.time()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def launch(run: LabRun, cache: Path) -> None:
    endpoint = f"{lab.address('h1')}:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache)})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--run-dir", str(run.run_dir), "--nproc", "1",
        "--steps", str(run.steps),
    ]  # fmt: skip
    cmds = [
        lab.on_host(host, ddpdoctor_cmd(*common, "--node-rank", str(node)))
        for node, host in enumerate(("h1", "h2"))
    ]
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd in cmds]
        if run.fault is not None:
            _fault(run)
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                out, err = "", f"launcher still running after {LAUNCH_TIMEOUT_S} s"
            run.nodes.append(Finished(proc.returncode, out, err, 0.0))
    # what node 0 printed, beside the run directory (for a reader of a failed run)
    run.run_dir.with_suffix(".node0.out").write_text(run.nodes[0].stdout + run.nodes[0].stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, LabRun]:
    tmp = tmp_path_factory.mktemp("lab-loss")
    cache = tmp / "cache"
    specs = {
        "healthy": LabRun(tmp / "healthy", None, steps=30),
        "host": LabRun(tmp / "host", "host"),
        "launcher": LabRun(tmp / "launcher", "launcher"),
    }
    threads = [threading.Thread(target=launch, args=(r, cache)) for r in specs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    yield specs
    for run in specs.values():  # nothing of a run outlives its test
        for host in ("h1", "h2"):
            for proc in _processes_on(host, run.run_dir):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


def _h2_ranks(doc: dict) -> list[int]:
    return sorted(r["rank"] for r in doc["ranks"] if r["host"] == "h2")


def test_a_healthy_two_host_job_raises_no_alarm(runs):
    run = runs["healthy"]
    assert [n.returncode for n in run.nodes] == [0, 0], run.explain()
    doc = run.diagnosis
    assert doc["verdict"] == "healthy", run.explain()
    assert not [f for f in doc["findings"] if f["id"].startswith("node.")], doc["findings"]


def test_a_host_whose_processes_were_all_killed_is_named_lost(runs):
    run = runs["host"]
    lead = run.nodes[0]
    assert run.fault_t is not None and lead.returncode == 1, run.explain()
    doc = run.diagnosis
    lost = _h2_ranks(doc)
    assert doc["verdict"] == "crash" and doc["culprits"] == lost, run.explain()
    first = doc["findings"][0]
    assert first["id"] == "node.lost" and first["summary"].startswith("host h2 lost"), first
    assert "last heard from at" in first["summary"]
    consequence = [f for f in doc["findings"] if f["id"] == "crash.consequence"]
    survivors = [r for r in sorted(r["rank"] for r in doc["ranks"]) if r not in lost]
    assert consequence and list(consequence[0]["ranks"]) == survivors, consequence
    assert f"CRASH: culprit rank {lost[0]} (host h2 lost)" in lead.stdout
    assert "verdict: crash (exit code 1)" in lead.stdout


def test_a_killed_node_launcher_is_named_and_not_blamed_on_its_rank(runs):
    run = runs["launcher"]
    lead = run.nodes[0]
    assert run.fault_t is not None and lead.returncode == 130, run.explain()
    doc = run.diagnosis
    assert doc["verdict"] == "interrupted" and doc["culprits"] == [], run.explain()
    first = doc["findings"][0]
    assert first["id"] == "node.launcher_killed" and "on h2" in first["summary"], first
    assert "stopped from outside" not in lead.stdout
    assert "verdict: interrupted (exit code 130)" in lead.stdout
