"""Ray Train with FailureConfig(max_failures=1): worker 1 fails once (raises, or SIGKILLs
itself), Ray's controller retries with a new worker group (the same world ranks, new processes)
and the run finishes. ddpdoctor must never stop it and end healthy, the failure named at warning
severity (docs/recovery.md). A worker that fails in every group spends the budget: a crash with
its culprit and line.

The jobs run on a running cluster (`ray start --head`, reached through RAY_ADDRESS, ddpdoctor
through Ray's runtime-env hook) and one on the local cluster its `ray.init()` starts. Ray's
raylet gives each of its agents about 15 s to write its port file and aborts when one is late,
which Ray's own agents are on a loaded 2-core machine (ray 2.60: "Timed out waiting for file
.../metrics_agent_port_..."), before any job runs: the head is started again then (Ray's
start-up, not a verdict of ddpdoctor's), and the local job is skipped when its own cluster
never started. The ray tier (`make test-ray`): minutes a job on two cores."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_ray import CLUSTER_START_S, MARK, _end_marked, _marked, _ray_env
from tests.procs import REPO, JsonRun, ddpdoctor_cmd, free_port, run_in_parallel

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(2400)]
SCRIPT = REPO / "tests" / "corpus" / "recover" / "ray_train_retry.py"
RUN_TIMEOUT_S = 900
PARALLEL = 2  # two jobs of two workers each fit the head's 4 CPUs
JOBS = {  # name: (mode, on the running cluster)
    "raise-once": ("raise", True),
    "sigkill-once": ("sigkill", True),
    "raise-always": ("raise-always", True),
    "raise-once-local": ("raise", False),
}
# Ray's own start-up of a local cluster failed (its raylet aborted): nothing of the job ran
RAY_DID_NOT_START = "The current node timed out during startup"


def _raise_line() -> str:
    lines = SCRIPT.read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if "raise RuntimeError(" in text)
    return f"ray_train_retry.py:{number}"


HEAD_TRIES = 3


def _start_head(base: Path, temp_dir: Path, port: int, mark: str, attempt: int):
    """`ray start --head --block`; (the process, None) once it blocks, (None, why) when Ray's
    raylet aborted in its own start-up."""
    ports = [f"--{name}={free_port()}" for name in ("node-manager-port", "object-manager-port")]
    ray = str(Path(sys.executable).parent / "ray")
    cmd = [
        ray, "start", "--head", "--block", f"--port={port}", *ports, "--num-cpus=4",
        "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    log_path = base / f"head-{attempt}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_ray_env(**{MARK: mark}),
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + CLUSTER_START_S
    while "--block" not in log_path.read_text(errors="replace"):
        raylet = list(temp_dir.glob("session_*/logs/raylet.out"))
        aborted = [
            r for r in raylet if "Timed out waiting for file" in r.read_text(errors="replace")
        ]
        if proc.poll() is not None or aborted or time.monotonic() > deadline:
            _end_marked(mark)
            return None, log_path.read_text(errors="replace")[-2000:] + "".join(
                r.read_text(errors="replace")[-2000:] for r in aborted
            )
        time.sleep(1)
    return proc, None


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A running Ray cluster (its head), every process of it marked; started again when Ray's
    raylet aborts in its own start-up."""
    base = tmp_path_factory.mktemp("ray-head")
    temp_dir = Path("/tmp") / f"ddpd-rr-{os.getpid()}"  # Ray's socket paths must stay short
    port = free_port()
    mark = f"{os.getpid()}-{port}"
    proc, why = None, ""
    try:
        for attempt in range(HEAD_TRIES):
            shutil.rmtree(temp_dir, ignore_errors=True)
            proc, why = _start_head(base, temp_dir, port, mark, attempt)
            if proc is not None:
                break
        assert proc is not None, f"the Ray head did not start in {HEAD_TRIES} tries: {why}"
        yield f"127.0.0.1:{port}"
    finally:
        _end_marked(mark)
        if proc is not None:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert _marked(mark) == [], "a process of the Ray cluster outlived it"


def _start(name: str, base: Path, address: str) -> subprocess.Popen:
    mode, running = JOBS[name]
    work = base / name
    work.mkdir()
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--json", "--run-dir", str(work / "run"),
        "--", sys.executable, str(SCRIPT), mode,
    )  # fmt: skip
    env = _ray_env()  # (it drops RAY_ADDRESS, whatever it is given)
    if running:
        env["RAY_ADDRESS"] = address
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),  # the child holds it; closed on exit
        stderr=open(work / "stderr", "w"),
        env=env,
        cwd=work,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def results(head, tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("ray-retry-jobs")
    starts = {name: functools.partial(_start, name, base, head) for name in JOBS}
    ended = run_in_parallel(starts, parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S)
    done = {}
    for name, (proc, timed_out) in ended.items():
        work = base / name
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[name] = JsonRun(None if timed_out else proc.returncode, stdout, stderr, work / "run")
    yield done
    shutil.rmtree(base, ignore_errors=True)


def _context(run: JsonRun) -> str:
    return run.stdout[-3000:] + "\n--- stderr ---\n" + run.stderr[-5000:]


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("raise-once", "worker 1 lost its data shard"),
        ("sigkill-once", "killed while running its training function"),  # Ray never sees the signal
        ("raise-once-local", "worker 1 lost its data shard"),
    ],
)
def test_a_ray_train_retry_is_recovered_not_stopped(results, name, cause):
    run = results[name]
    if RAY_DID_NOT_START in run.stderr and not (run.run_dir / "events" / "rank-0.jsonl").exists():
        pytest.skip("Ray's local cluster did not start (its raylet aborted): no job ran")
    doc = run.document()
    assert run.returncode == 0, _context(run)
    assert doc["verdict"] == "healthy" and (doc.get("job") or {}).get("stopped_for") is None, (
        _context(run)
    )
    assert not [f for f in doc["findings"] if f["severity"] == "error"], _context(run)
    recovered = next(f for f in doc["findings"] if f["id"] == "run.recovered")
    assert cause in recovered["summary"] and recovered["ranks"] == [1], recovered
    if "killed" not in cause:
        assert _raise_line() in recovered["summary"], recovered
    written = json.loads((run.run_dir / "diagnosis.json").read_text())
    attempts = written["attempts"]
    assert attempts["budget_from"] == "Ray Train FailureConfig(max_failures)", attempts
    assert attempts["recovered"] is True and attempts["current"] == 2, attempts
    assert "attempt 1 of 2" in run.stderr  # the status line said which attempt ran


def test_a_spent_ray_train_budget_is_a_crash_with_its_culprit_and_line(results):
    run = results["raise-always"]
    doc = run.document()
    assert run.returncode == 1 and doc["verdict"] == "crash", _context(run)
    assert doc["culprits"] == [1], _context(run)
    headline = doc["findings"][0]
    assert headline["severity"] == "error" and _raise_line() in headline["summary"], headline
    earlier = next(f for f in doc["findings"] if f["id"] == "run.attempts")
    assert "attempt 1 of 2" in earlier["summary"] and _raise_line() in earlier["summary"]
    attempts = json.loads((run.run_dir / "diagnosis.json").read_text())["attempts"]
    assert attempts["max_restarts"] == 1 and attempts["recovered"] is False, attempts
