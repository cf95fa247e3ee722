"""A Ray cluster on two lab hosts (scripts/lab.sh ray: head on h1, a node on h2).

The module starts the cluster when it is not up and stops it at the end (a cluster it found
running is left as it was). `doctor --distributed --ray` runs one task per node: healthy, and
with GLOO_SOCKET_IFNAME naming the interface that reaches no peer; and on a one-host cluster it
starts itself (`--ray local`). `ddpdoctor run -- python ray_lab_train.py` on h1 runs a
TorchTrainer whose two workers land on h1 and h2, both ways: with one run directory for both
hosts (under /tmp, as on NFS), and with a directory each host has to itself
(/run/ddplab/ray/local: h2's Ray sees its own folder there), where h2's rank reaches the watcher
only through Ray (the relay's node actor).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import lab
from tests.procs import PYTHON, REPO, background, clean_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(900),
]

RAY_DIR = lab.STATE / "ray"
ADDRESS = f"{lab.address('h1')}:6390"
LOCAL = RAY_DIR / "local"  # each host's own directory (h1: this path; h2: its own folder)
JOB = REPO / "tests" / "launch_jobs" / "ray_lab_train.py"
T = 10


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'ray[train]')"
    return None


def _ray_cmd(what: str) -> list[str]:
    return ["bash", str(lab.LAB_SCRIPT), what]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    reason = _ray_missing()
    if reason:
        pytest.skip(reason)
    was_up = (RAY_DIR / "up").exists()
    env = clean_env({"RAY": str(Path(PYTHON).parent / "ray")})
    started = subprocess.run(
        _ray_cmd("ray"), env=env, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield ADDRESS
    finally:
        if not was_up:
            subprocess.run(_ray_cmd("ray-stop"), env=env, capture_output=True, timeout=120)


def _doctor(*extra: str, host: str | None = "h1", env: dict[str, str] | None = None) -> list[str]:
    cmd = [PYTHON, "-m", "ddpdoctor", "doctor", "--distributed", "--json", "--timeout", str(T),
           *extra]  # fmt: skip
    return lab.on_host(host, cmd) if host else cmd


@pytest.fixture(scope="module")
def doctors(cluster: str) -> dict[str, tuple[int, dict, str]]:
    """Both lab runs at once, then the one-host cluster (it starts its own Ray here)."""
    tmp = tempfile.mkdtemp(prefix="rdr", dir="/tmp")  # short: Ray's socket paths live in it
    jobs = {
        "healthy": (_doctor("--ray", cluster), clean_env()),
        "eth1": (_doctor("--ray", cluster), clean_env({"GLOO_SOCKET_IFNAME": "eth1"})),
    }
    results: dict[str, tuple[int, dict, str]] = {}
    with contextlib.ExitStack() as stack:
        procs = {n: stack.enter_context(background(c, env=e)) for n, (c, e) in jobs.items()}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            results[name] = (proc.returncode, json.loads(out) if out.strip() else {}, err)
    env = clean_env({"RAY_TMPDIR": tmp, "RAY_ADDRESS": ""})
    with background(_doctor("--ray", "local", host=None), env=env) as proc:
        out, err = proc.communicate(timeout=300)
        results["one-host"] = (proc.returncode, json.loads(out) if out.strip() else {}, err)
    return results


def _result(report: dict, check: str) -> dict:
    return next(r for r in report["results"] if r["id"] == check)


def test_the_doctor_runs_once_on_each_ray_node_and_the_network_passes(doctors):
    code, report, err = doctors["healthy"]
    assert code == 0 == report.get("exit_code"), err[-3000:]
    cluster = report["cluster"]
    assert cluster["launcher"] == "ray"
    assert sorted(n["host"] for n in cluster["nodes"]) == ["h1", "h2"]
    assert cluster["nodes"][0]["host"] == "h1"  # the driver's node leads
    reached = _result(report, "cluster.ifname")
    assert reached["status"] == "pass" and "eth0" in reached["facts"]["common"]


def test_an_interface_forced_on_the_driver_is_judged_on_every_node(doctors):
    code, report, err = doctors["eth1"]
    assert code == 1 == report.get("exit_code"), err[-3000:]
    reached = _result(report, "cluster.ifname")
    assert reached["status"] == "fail"
    assert "GLOO_SOCKET_IFNAME=eth1" in reached["summary"]
    assert "node 1 (h2)" in reached["summary"] or "node 1 (h2)" in " ".join(reached["details"])


def test_the_doctor_on_a_one_host_cluster_it_starts_itself(doctors):
    code, report, err = doctors["one-host"]
    assert code == 0 == report.get("exit_code"), err[-3000:]
    assert report["cluster"]["launcher"] == "ray"
    assert len(report["cluster"]["nodes"]) == 1
