"""torchft jobs on real torchft (CPU, gloo): a lighthouse and two replica groups, each its own
torchrun, started by one command (a shell driver or a Python driver) under
`ddpdoctor run --no-tui --json -- COMMAND` (tests/corpus/torchft/). Healthy, a replica killed
once that its torchrun restarts and that heals, a replica stalled in its step. Each job starts
five processes that import torch: slow; the jobs run together in one module fixture.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import REPO, JsonRun, clean_env, ddpdoctor_cmd, run_in_parallel

pytest.importorskip("torchft")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

CORPUS = REPO / "tests" / "corpus" / "torchft"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
JOBS = {job["name"]: job for kind in ("healthy", "recovering", "faulty") for job in MANIFEST[kind]}
RUN_TIMEOUT_S = 600
PARALLEL = 3


def _start(name: str, base: Path) -> subprocess.Popen:
    job = JOBS[name]
    work = base / name
    work.mkdir()
    program, driver, *rest = job["command"]  # python|bash, the driver, its arguments
    words = [sys.executable if program == "python" else program, str(CORPUS / driver), *rest]
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--json", "--run-dir", str(work / "run"), "--", *words
    )
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # torchrun, lighthouse
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),  # the child holds it; closed on exit
        stderr=open(work / "stderr", "w"),
        env=env,
        cwd=work,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("torchft-jobs")
    starts = {name: functools.partial(_start, name, base) for name in JOBS}
    ended = run_in_parallel(starts, parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S)
    done = {}
    for name, (proc, timed_out) in ended.items():
        work = base / name
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[name] = JsonRun(None if timed_out else proc.returncode, stdout, stderr, work / "run")
    # the run directories stay for a failure's diagnosis (pytest keeps its last three sessions'
    # temporary directories): a replica that recovered is told from one run's events and logs
    return done


def _loud(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] in ("warning", "error")]


def _context(run: JsonRun) -> str:
    return f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.mark.parametrize("name", [j["name"] for j in MANIFEST["healthy"]])
def test_a_healthy_torchft_job_is_one_distributed_run(results, name):
    run = results[name]
    doc = run.document()
    assert run.returncode == 0 and doc["verdict"] == "healthy", _context(run)
    assert _loud(doc) == [], _context(run)
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    for rank in (0, 1):
        hello = run.events(rank, "hello")[-1]
        assert hello["torchft"]["replica_group"] == rank and hello["backend"] == "torchft-gloo"
        starts = run.events(rank, "collective_start")
        assert starts and all(s["group"].startswith("torchft:q") for s in starts)
        quorums = [e for e in run.events(rank, "torchft") if e["what"] == "quorum"]
        assert quorums and quorums[-1]["replica_groups"] == [0, 1]


@pytest.mark.parametrize("name", [j["name"] for j in MANIFEST["recovering"]])
def test_a_replica_killed_once_that_heals_is_recovery_not_a_crash(results, name):
    run = results[name]
    doc = run.document()
    assert run.returncode == 0 and doc["verdict"] == "healthy", _context(run)
    assert (doc.get("job") or {}).get("stopped_for") is None
    assert not [f for f in doc["findings"] if f["severity"] == "error"], _context(run)
    recovered = [f for f in doc["findings"] if f["id"] == "torchft.replica_recovered"]
    killed = [f for f in recovered if f["ranks"] == [1]]
    assert killed and all(f["severity"] == "warning" for f in recovered), _context(run)
    assert "replica group 1" in killed[0]["summary"] and "SIGKILL" in killed[0]["summary"]
    assert {f["id"] for f in _loud(doc)} <= set(JOBS[name]["warnings"]), _context(run)
    hellos = run.events(1, "hello")
    assert {h["restart_count"] for h in hellos} == {0, 1}  # the group's torchrun restarted it


@pytest.mark.parametrize("name", [j["name"] for j in MANIFEST["faulty"]])
def test_a_stalled_replica_is_a_hang_of_its_group_with_its_line(results, name):
    run = results[name]
    doc = run.document()
    job = JOBS[name]
    assert doc["verdict"] == job["verdict"], _context(run)
    assert doc["culprits"] == job["culprits"], _context(run)
    assert run.returncode == 1 and (doc.get("job") or {}).get("stopped_for") == "hang"
    headline = next(f for f in doc["findings"] if f["severity"] == "error")
    assert job["line"] in headline["summary"], headline
