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
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import lab
from tests.procs import PYTHON, REPO, background, clean_env, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.ray,
    pytest.mark.skipif(lab.down_reason() is not None, reason=lab.down_reason() or ""),
    pytest.mark.timeout(1800),
]

RAY_DIR = lab.STATE / "ray"
ADDRESS = f"{lab.address('h1')}:6390"
LOCAL = RAY_DIR / "local"  # each host's own directory (h1: this path; h2: its own folder)
JOB = REPO / "tests" / "launch_jobs" / "ray_lab_train.py"
SLEEP_LINE = next(
    n for n, line in enumerate(JOB.read_text().splitlines(), 1) if "time.sleep(3600)" in line
)
T = 30  # the collective check shares it: a loaded 2-core machine needs room


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
    """The one-host cluster first (it starts its own Ray here, alone), then both lab runs at
    once."""
    results: dict[str, tuple[int, dict, str]] = {}
    for _attempt in range(2):
        tmp = tempfile.mkdtemp(prefix="rdr", dir="/tmp")  # short: Ray's socket paths live in it
        env = clean_env({"RAY_TMPDIR": tmp, "RAY_ADDRESS": ""})
        with background(_doctor("--ray", "local", host=None), env=env) as proc:
            out, err = proc.communicate(timeout=300)
        results["one-host"] = (proc.returncode, json.loads(out) if out.strip() else {}, err)
        # Ray gives a node it starts 30 s to register (ray/_private/node.py), a limit a loaded
        # 2-core machine can pass: once more then, as a user would.
        if "timed out during startup" not in err:
            break
    jobs = {
        "healthy": (_doctor("--ray", cluster), clean_env()),
        "eth1": (_doctor("--ray", cluster), clean_env({"GLOO_SOCKET_IFNAME": "eth1"})),
    }
    with contextlib.ExitStack() as stack:
        procs = {n: stack.enter_context(background(c, env=e)) for n, (c, e) in jobs.items()}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            results[name] = (proc.returncode, json.loads(out) if out.strip() else {}, err)
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


# -- ddpdoctor run around Ray Train jobs on the two hosts ---------------------------------------

RUNS = {  # name: (mode, where the run directory is)
    "healthy-shared": ("healthy", "shared"),
    "sigkill-shared": ("sigkill", "shared"),
    "healthy-private": ("healthy", "private"),
    "stall-private": ("stall", "private"),
}


def _instrumented() -> str | None:
    import importlib.util

    if importlib.util.find_spec("ddpdoctor.runtime.ray_env") is None:
        return "this ddpdoctor does not instrument Ray's workers (ddpdoctor.runtime.ray_env)"
    return None


@pytest.fixture(scope="module")
def runs(cluster: str) -> Iterator[dict[str, tuple[int, dict, str, Path]]]:
    """The four jobs, two at a time (each takes one CPU on each host: two fit)."""
    reason = _instrumented()
    if reason:
        pytest.skip(reason)
    shared = Path(tempfile.mkdtemp(prefix="lab-ray-"))
    LOCAL.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix="lab-ray-", dir=LOCAL))
    results: dict[str, tuple[int, dict, str, Path]] = {}
    names = list(RUNS)
    for pair in (names[0::2], names[1::2]):
        with contextlib.ExitStack() as stack:
            procs = {}
            for name in pair:
                mode, where = RUNS[name]
                run_dir = (shared if where == "shared" else private) / name
                cmd = [PYTHON, "-m", "ddpdoctor", "run", "--no-doctor", "--no-tui", "--json",
                       "--hang-after", "5", "--run-dir", str(run_dir), "--",
                       PYTHON, str(JOB), mode, "10", "h2"]  # fmt: skip
                env = clean_env({"RAY_ADDRESS": cluster})
                procs[name] = (stack.enter_context(background(lab.on_host("h1", cmd), env=env)),
                               run_dir)  # fmt: skip
            for name, (proc, run_dir) in procs.items():
                try:
                    out, err = proc.communicate(timeout=600)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"ddpdoctor run ({name}) did not end within 600 s")
                doc = json.loads(out) if out.strip() else {}
                results[name] = (proc.returncode, doc, err, run_dir)
    yield results


def _ranks(doc: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in doc.get("ranks", [])}


def _on(doc: dict, host: str) -> int:
    """The rank that ran on `host` (the culprit's host: Ray Train numbers its workers)."""
    return next(r["rank"] for r in doc["ranks"] if r["host"] == host)


@pytest.mark.parametrize("name", ["healthy-shared", "healthy-private"])
def test_a_healthy_job_across_two_hosts_is_healthy(runs, name):
    code, doc, err, run_dir = runs[name]
    assert code == 0 and doc.get("verdict") == "healthy", err[-3000:]
    ranks = _ranks(doc)
    assert sorted(r["host"] for r in ranks.values()) == ["h1", "h2"]  # Ray Train numbers them
    assert all(r["step"] == 10 for r in ranks.values())  # steps counted on both hosts
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    # h2's rank's events are in the run directory at the end, whichever way it got there
    on_h2 = _on(doc, "h2")
    assert (run_dir / "events" / f"rank-{on_h2}.jsonl").stat().st_size > 0
    if name.endswith("private"):
        assert (run_dir / "nodes" / "node-1" / "summary.json").is_file()


def test_a_rank_killed_on_the_other_host_is_the_first_death(runs):
    code, doc, err, _ = runs["sigkill-shared"]
    assert code == 1 and doc.get("verdict") == "crash", err[-3000:]
    assert doc["culprits"] == [_on(doc, "h2")]


def test_a_stalled_rank_on_a_host_with_its_own_run_directory_is_the_hang(runs):
    code, doc, err, _ = runs["stall-private"]
    assert code == 1 and doc.get("verdict") == "hang", err[-3000:]
    assert doc["culprits"] == [_on(doc, "h2")]
    assert f"{JOB.name}:{SLEEP_LINE}" in json.dumps(doc)  # the line it sleeps on


def _train_processes() -> list[str]:
    """The Ray Train processes still running on the lab's hosts (their own pid namespaces)."""
    import psutil

    spaces = set()
    for host in lab.hosts():
        with contextlib.suppress(OSError, ValueError):
            pid = int((lab.STATE / f"{host}.pid").read_text())
            spaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
    left = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(OSError, psutil.Error):
            text = " ".join(proc.info["cmdline"] or [proc.info["name"] or ""])
            if ("RayTrain" in text or JOB.name in text) and os.readlink(
                f"/proc/{proc.pid}/ns/pid"
            ) in spaces:
                left.append(f"{proc.pid} {text[:80]}")
    return left


def test_no_process_of_the_jobs_is_left_on_the_cluster(runs):
    wait_for(
        lambda: not _train_processes(), timeout=60, interval=2, what="the jobs' processes to end"
    )
