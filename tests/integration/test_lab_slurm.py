"""`srun -N 2` on the lab's own Slurm (make lab-cluster): ranks on two hosts for real, started by
Slurm. `doctor --distributed` healthy and with GLOO_SOCKET_IFNAME naming the interface that
reaches no peer, and `ddpdoctor run -- srun -N 2` with a rank on h2 that hangs, all at once."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from tests import lab
from tests.procs import PYTHON, REPO, background, clean_env, free_port, job_processes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.slurm,
    pytest.mark.skipif(lab.slurm_down_reason() is not None, reason=lab.slurm_down_reason() or ""),
    pytest.mark.timeout(300),
]

T = 8
HANG_JOB = REPO / "tests" / "launch_jobs" / "env_hang.py"


def doctor_cmd(port: int, **extra: str) -> tuple[list[str], dict[str, str]]:
    env = clean_env({"SLURM_CONF": str(lab.SLURM_CONF), "MASTER_ADDR": lab.address("h1"),
                     "MASTER_PORT": str(port), **extra})  # fmt: skip
    cmd = ["srun", "-N", "2", "--ntasks-per-node", "1", "--time", "3",
           PYTHON, "-m", "ddpdoctor", "doctor", "--distributed", "--json", "--timeout", str(T)]  # fmt: skip
    return lab.on_host("h1", cmd), env


def run_hang_cmd(run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """`ddpdoctor run` on h1 around `srun -N 2`: rank 1 (on h2) hangs at step 3. Only h1 has a
    launcher, so rank 1's stack cannot be taken (another host's pid namespace)."""
    srun = ["srun", "-N", "2", "--ntasks-per-node", "1", "--time", "3", PYTHON, str(HANG_JOB),
            "--steps", "30", "--hang-rank", "1", "--hang-step", "3"]  # fmt: skip
    cmd = [PYTHON, "-m", "ddpdoctor", "run", "--no-doctor", "--no-tui", "--json",
           "--hang-after", "2", "--run-dir", str(run_dir), "--", *srun]  # fmt: skip
    return lab.on_host("h1", cmd), clean_env({"SLURM_CONF": str(lab.SLURM_CONF)})


@pytest.fixture(scope="module")
def sruns(tmp_path_factory) -> dict[str, tuple[int, dict, str]]:
    """The three jobs at once (the third waits in Slurm's queue for a free CPU)."""
    run_dir = tmp_path_factory.mktemp("lab-srun") / "run"
    jobs = {
        "healthy": doctor_cmd(free_port()),
        "eth1": doctor_cmd(free_port(), GLOO_SOCKET_IFNAME="eth1"),
        "run-hang": run_hang_cmd(run_dir),
    }
    results: dict[str, tuple[int, dict, str]] = {}
    with contextlib.ExitStack() as stack:
        procs = {n: stack.enter_context(background(c, env=e)) for n, (c, e) in jobs.items()}
        for name, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=200)
            except subprocess.TimeoutExpired:
                pytest.fail(f"srun ({name}) did not end within 200 s")
            results[name] = (proc.returncode, json.loads(out) if out.strip() else {}, err)
    results["run-dir"] = (0, {"path": str(run_dir)}, "")
    return results


def test_srun_places_one_rank_on_each_lab_host_and_the_network_passes(sruns):
    code, report, err = sruns["healthy"]
    assert code == 0 == report.get("exit_code"), err[-3000:]
    cluster = report["cluster"]
    assert cluster["launcher"] == "slurm"
    assert sorted(n["host"] for n in cluster["nodes"]) == ["h1", "h2"]
    reached = next(r for r in report["results"] if r["id"] == "cluster.ifname")
    assert reached["status"] == "pass" and reached["facts"]["common"] == ["eth0"]


def test_srun_with_the_interface_that_reaches_no_peer_is_named(sruns):
    code, report, err = sruns["eth1"]
    assert code == 1 == report.get("exit_code"), err[-3000:]
    group = next(r for r in report["results"] if r["id"] == "cluster.group")
    assert "(GLOO_SOCKET_IFNAME=eth1), which node 1 (h2) cannot reach" in group["summary"]
    assert "Set GLOO_SOCKET_IFNAME=eth0" in group["fix"]
    assert report["elapsed_s"] <= T + 5


def test_run_around_srun_names_the_hung_rank_on_the_other_host(sruns):
    code, doc, err = sruns["run-hang"]
    run_dir = Path(sruns["run-dir"][1]["path"])
    assert code == 1 and doc.get("verdict") == "hang", err[-3000:]
    assert doc["culprits"] == [1]
    hosts = {r["rank"]: r["host"] for r in doc["ranks"]}
    assert hosts == {0: "h1", 1: "h2"}
    assert job_processes(run_dir) == []
