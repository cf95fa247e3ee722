"""A lost host named as lost, whoever saw the connection close first and whatever the survivors'
scripts said, during training and during start-up; and no verdict on the way to a healthy end.
For real in the lab (make lab): `ddpdoctor run --nnodes 2` on h1 and h2 with users' scripts in
two styles (tests/launch_jobs/late_host_init.py: module level; guarded_trainer.py: helpers, a
`__main__` guard, a loop that catches the reset and exits 1 with a message of its own).

- start-up, every process of the job on h2 SIGKILLed while h1's rank waits in
  init_process_group for h2's (which prepares slowly): HANG, h2 named lost "while the job was
  starting", the job stopped — not a wait for torch's 10 to 30 minute timeout;
- start-up, h2 frozen (every process of the job there SIGSTOPped: a host that hangs) in the
  other style: the same;
- training, every process of the job on h2 SIGKILLed while the survivor's script turns the
  reset into `exit 1`: CRASH, h2's rank the culprit, h2 lost, the survivor a consequence — and
  no view on the way named the survivor;
- a healthy two-host job of the second style, every diagnosis.json written while it ran and
  every status line recorded: never a problem verdict, healthy at the end.

The four run at once (about 2 minutes on a busy 2-core machine).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests import lab
from tests.integration.test_lab_node_loss import _processes_on, _training
from tests.procs import REPO, Finished, background, clean_env, ddpdoctor_cmd, free_port, kill_group

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(600),
]

JOBS = REPO / "tests" / "launch_jobs"
LAUNCH_TIMEOUT_S = 280
PROBLEM_LINE = re.compile(r"^(HANG|CRASH|MISMATCH|NOT STARTED)\b", re.M)


@dataclass
class Run:
    run_dir: Path
    script: str
    fault: str | None  # "startup-kill", "startup-stop", "train-kill" or None
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[Finished] = field(default_factory=list)
    fault_t: float | None = None
    ended_t: float | None = None
    shown: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # diagnosis.json's

    def explain(self) -> str:
        return "\n".join(f"--- node {i}\n{n.stdout[-12000:]}\n{n.stderr[-1500:]}"
                         for i, n in enumerate(self.nodes))  # fmt: skip

    @property
    def diagnosis(self) -> dict:
        return json.loads((self.run_dir / "diagnosis.json").read_text())


def _rank_started(run: Run, host: str) -> bool:
    """A rank's process runs on the host (torchrun's worker, RANK in its environment: it is
    importing, preparing, or waiting in init_process_group)."""
    for proc in _quiet(_processes_on, host, run.run_dir):
        with contextlib.suppress(psutil.Error):
            if "RANK" in proc.environ() and "LOCAL_RANK" in proc.environ():
                return True
    return False


def _quiet(fn, *args):
    try:
        return fn(*args)
    except psutil.Error:
        return []


def _fault(run: Run) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S - 20  # (starting takes minutes under load)
    if run.fault == "train-kill":
        ready = lambda: _training(run.run_dir)  # noqa: E731
    else:  # both ranks' processes up, h1's in init_process_group a while, no rank joined
        ready = lambda: _rank_started(run, "h1") and _rank_started(run, "h2")  # noqa: E731
    while not ready():
        if time.monotonic() > deadline:
            return
        time.sleep(0.3)
    if run.fault != "train-kill":
        time.sleep(4.0)
        assert not list((run.run_dir / "events").glob("rank-*.jsonl")), "a rank joined"
    how = signal.SIGSTOP if run.fault == "startup-stop" else signal.SIGKILL
    procs = _processes_on("h2", run.run_dir)
    run.fault_t = time.time()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(how)


def _record(run: Run, stop: threading.Event) -> None:
    """Every verdict diagnosis.json shows while the job runs (read every 50 ms)."""
    path = run.run_dir / "diagnosis.json"
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
            shown = (doc["verdict"], tuple(doc.get("culprits") or ()))
            if not run.shown or run.shown[-1] != shown:
                run.shown.append(shown)
        stop.wait(0.05)


def launch(run: Run, cache: Path) -> None:
    endpoint = f"{lab.address('h1')}:{free_port()}"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(cache), **run.env})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--run-dir", str(run.run_dir), "--nproc", "1",
    ]  # fmt: skip
    cmds = [
        lab.on_host(host, ddpdoctor_cmd(*common, "--node-rank", str(node), "--", run.script))
        for node, host in enumerate(("h1", "h2"))
    ]
    stop = threading.Event()
    recorder = threading.Thread(target=_record, args=(run, stop), daemon=True)
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(background(cmd, env=env)) for cmd in cmds]
        recorder.start()
        if run.fault is not None:
            _fault(run)
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # (what it printed until then, to explain)
                kill_group(proc)
                try:
                    out, err = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:  # (a process out of the group holds it)
                    out, err = "", ""
                err += f"\nlauncher still running after {LAUNCH_TIMEOUT_S} s"
            run.nodes.append(Finished(proc.returncode, out, err, 0.0))
            if run.ended_t is None:
                run.ended_t = time.time()
                if run.fault == "startup-stop":  # the frozen host's launcher: end it now
                    for frozen in _quiet(_processes_on, "h2", run.run_dir):
                        with contextlib.suppress(psutil.Error):
                            frozen.kill()
                    procs[1].kill()  # (its nsenter, stopped with it)
        stop.set()
        recorder.join(5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("lab-lost")
    cache = tmp / "cache"
    late, guarded = str(JOBS / "late_host_init.py"), str(JOBS / "guarded_trainer.py")
    slow_h2 = {"SLOW_HOST": "h2", "SLOW_S": "150"}
    specs = {
        "startup-kill": Run(tmp / "startup-kill", late, "startup-kill", env=slow_h2),
        "startup-stop": Run(tmp / "startup-stop", guarded, "startup-stop", env=slow_h2),
        "train-kill": Run(tmp / "train-kill", guarded, "train-kill", env={"STEPS": "3000"}),
        "healthy": Run(tmp / "healthy", guarded, None, env={"STEPS": "150"}),
    }
    threads = [threading.Thread(target=launch, args=(r, cache)) for r in specs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    yield specs
    for run in specs.values():  # nothing of a run outlives its test (a stopped one: killed)
        for host in ("h1", "h2"):
            for proc in _processes_on(host, run.run_dir):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


def _lost_while_starting(run: Run) -> None:
    lead = run.nodes[0]
    assert run.fault_t is not None and lead.returncode == 1, run.explain()
    doc = run.diagnosis
    assert doc["verdict"] == "hang", run.explain()
    first = doc["findings"][0]
    assert first["id"] == "node.lost" and first["summary"].startswith("host h2 lost"), first
    assert "while the job was starting" in first["summary"]
    assert "verdict: hang (exit code 1)" in lead.stdout
    # named and stopped within seconds of the start-up threshold, not at torch's timeout
    assert run.ended_t is not None and run.ended_t - run.fault_t < 45, run.explain()


def test_a_host_killed_while_the_ranks_start_is_named_lost(runs):
    _lost_while_starting(runs["startup-kill"])


def test_a_host_frozen_while_the_ranks_start_is_named_lost(runs):
    _lost_while_starting(runs["startup-stop"])


def test_a_survivor_that_exits_1_on_the_reset_is_a_consequence_of_the_lost_host(runs):
    run = runs["train-kill"]
    lead = run.nodes[0]
    assert run.fault_t is not None and lead.returncode == 1, run.explain()
    doc = run.diagnosis
    lost = sorted(r["rank"] for r in doc["ranks"] if r["host"] == "h2")
    survivors = sorted(r["rank"] for r in doc["ranks"] if r["host"] == "h1")
    assert doc["verdict"] == "crash" and doc["culprits"] == lost, run.explain()
    assert doc["findings"][0]["id"] == "node.lost", doc["findings"][0]
    assert f"CRASH: culprit rank {lost[0]} (host h2 lost)" in lead.stdout
    # no view on the way blamed the survivor: not the status lines, not diagnosis.json
    assert f"culprit rank {survivors[0]}" not in lead.stdout, run.explain()
    assert not [s for s in run.shown if s[0] == "crash" and s[1] != tuple(lost)], run.shown


def test_a_healthy_two_host_job_never_shows_a_problem_on_its_way(runs):
    run = runs["healthy"]
    assert [n.returncode for n in run.nodes] == [0, 0], run.explain()
    assert run.diagnosis["verdict"] == "healthy"
    assert run.shown and run.shown[-1][0] == "healthy", run.shown
    assert {verdict for verdict, _ in run.shown} <= {"running", "healthy"}, run.shown
    for node in run.nodes:
        assert not PROBLEM_LINE.findall(node.stdout), node.stdout[-3000:]
        assert "verdict: healthy (exit code 0)" in node.stdout
