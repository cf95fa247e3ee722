"""The preflight informs, facts refuse (`ddpdoctor run` with its doctor on, as users run it).

Healthy Lightning and accelerate jobs, written as their docs teach, with a collective under a
rank guard on a branch the chosen mode never runs (a fault-injection flag): the script checkup
flags the line, the run prints it before the launch, keeps it in doctor.json, and the job runs
to a healthy verdict. A held master port (one node, and node 0 of two with a loopback master
address) refuses the launch, and diagnosis.json then holds the refusing checks themselves.

And a run whose stdout cannot encode what it prints (PYTHONIOENCODING=ascii) prints every line.

The runs start together in one module fixture (their preflights' smoke tests and the
frameworks' imports are most of their time).
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import PYTHON, REPO, clean_env, ddpdoctor_cmd, run_in_parallel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GUARDED = REPO / "tests" / "corpus" / "guarded"
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
RUN_TIMEOUT_S = 420  # Lightning imports for minutes on a loaded 2-core machine


@dataclass(frozen=True)
class Ran:
    returncode: int | None
    stdout: str
    stderr: str
    run_dir: Path

    def diagnosis(self) -> dict:
        return json.loads((self.run_dir / "diagnosis.json").read_text())

    def doctor(self, node: int | None = None) -> dict:
        where = "doctor.json" if node is None else f"nodes/node-{node}/doctor.json"
        return json.loads((self.run_dir / where).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[dict[str, Ran]]:
    base = tmp_path_factory.mktemp("gate")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = str(held.getsockname()[1])
    run = ("run", "--no-tui", "--json")
    jobs = {
        "lightning": [*run, "--", PYTHON, str(GUARDED / "lit_debug_fault.py")],
        "accelerate": [
            *run, "--", TORCHRUN, "--nproc-per-node", "2",
            str(GUARDED / "acc_debug_fault.py"), "--cpu",
        ],
        "port-held": [*run, "--nproc", "1", "--backend", "gloo", "--master-port", port],
        "port-held-node0": [
            *run, "--nproc", "1", "--backend", "gloo", "--nnodes", "2", "--node-rank", "0",
            "--master-addr", "127.0.0.1", "--master-port", port,
        ],
        "ascii": [
            "run", "--no-tui", "--no-doctor", "--nproc", "2", "--backend", "gloo", "--steps", "6",
        ],
    }  # fmt: skip
    envs = {"ascii": {"PYTHONIOENCODING": "ascii"}}
    files = {}

    def starter(name: str, args: list[str]):
        def start() -> subprocess.Popen:
            out = (base / f"{name}.out").open("w")
            err = (base / f"{name}.err").open("w")
            files[name] = (out, err)
            argv = ddpdoctor_cmd(*args[:3], "--run-dir", str(base / name), *args[3:])
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                env=clean_env(envs.get(name)),
                start_new_session=True,
                cwd=base,
            )

        return start

    try:
        done = run_in_parallel(
            {name: starter(name, args) for name, args in jobs.items()},
            parallel=5,
            timeout_s=RUN_TIMEOUT_S,
        )
    finally:
        held.close()
    results = {}
    for name, (proc, killed) in done.items():
        for fh in files[name]:
            fh.close()
        results[name] = Ran(
            None if killed else proc.returncode,
            (base / f"{name}.out").read_text(),
            (base / f"{name}.err").read_text(),
            base / name,
        )
    yield results


@pytest.mark.parametrize("job", ["lightning", "accelerate"])
def test_a_guarded_collective_the_job_never_runs_does_not_stop_it(runs, job):
    ran = runs[job]
    assert ran.returncode == 0, ran.stderr[-3000:]
    doc = json.loads(ran.stdout)
    assert doc["verdict"] == "healthy" and doc["job"]["started"] is True
    # printed before the launch, with its line and fix, and why it does not refuse
    assert "barrier() runs only under the rank guard" in ran.stderr
    assert "fix: call it on every rank" in ran.stderr
    assert "the job starts" in ran.stderr and "was not started" not in ran.stderr
    # kept in the run, for the diagnosis to cite if the symptom appears
    script = [r for r in ran.doctor()["results"] if r["group"] == "script"]
    assert [r["facts"]["rule"] for r in script] == ["script.collective_under_rank_guard"]
    assert script[0]["facts"]["line"] > 0


def test_a_held_port_refuses_and_diagnosis_json_says_which_check(runs):
    ran = runs["port-held"]
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert "the job was not started" in ran.stderr
    diagnosis = ran.diagnosis()
    assert diagnosis["verdict"] == "not_started"
    first = diagnosis["findings"][0]
    assert first["id"] == "preflight.network.master_port"
    assert "already in use" in first["summary"] and first["fix"]
    assert first["evidence"][0]["file"] == "doctor.json"


def test_a_refused_node_of_two_leaves_diagnosis_json_with_its_checks(runs):
    ran = runs["port-held-node0"]
    assert ran.returncode == 1, ran.stderr[-3000:]
    diagnosis = ran.diagnosis()
    assert diagnosis["verdict"] == "not_started"
    ids = [f["id"] for f in diagnosis["findings"]]
    assert "preflight.network.master_port" in ids and "preflight.network.master_addr" in ids
    assert "run.nodes_missing" not in ids  # node 1 was never asked to join
    assert all(f["fix"] for f in diagnosis["findings"] if f["id"].startswith("preflight."))
    assert ran.doctor(0)["counts"]["fail"] >= 2


def test_a_run_whose_stdout_is_ascii_prints_every_line(runs):
    ran = runs["ascii"]
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert any(line.startswith("healthy ") for line in lines)  # the status lines
    assert "HEALTHY: all 2 ranks finished" in ran.stdout
    assert lines[-1] == "verdict: healthy (exit code 0)"
