"""`ddpdoctor doctor` end to end through the CLI: every bad input of the network, rendezvous and
system checks is a named result with the documented exit code and no traceback; an interrupted
smoke test leaves no rank behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.procs import PYTHON, REPO, background, clean_env, ddpdoctor_cmd, run, wait_for

pytestmark = pytest.mark.integration
READ_ONLY_DIR = "/sys/kernel"  # sysfs refuses new files even to root (chmod does not stop root)


def doctor(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()):
    """Run `ddpdoctor doctor ARGS --json`; the exit code and the results by id."""
    done = run([*prefix, *ddpdoctor_cmd("doctor", *args, "--json")], timeout=60, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    document = json.loads(done.stdout)
    assert document["schema_version"] == 1 and document["exit_code"] == done.returncode
    return done.returncode, {r["id"]: r for r in document["results"]}


def assert_named_failure(results, check_id: str, *needles: str) -> dict:
    result = results[check_id]
    assert result["status"] == "fail", result
    for needle in needles:
        assert needle in result["summary"], result["summary"]
    assert result["fix"]
    return result


def test_master_port_out_of_range():
    code, results = doctor("network.master_port", env=clean_env({"MASTER_PORT": "99999"}))
    assert code == 1
    assert_named_failure(results, "network.master_port", "MASTER_PORT=99999", "1..65535")


def test_master_port_really_in_use():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        code, results = doctor("network", "--master-port", str(port), env=clean_env())
    assert code == 1
    result = assert_named_failure(
        results, "network.master_port", f"port {port} is already in use", f"pid {os.getpid()}"
    )
    assert result["facts"]["owners"][0]["pid"] == os.getpid()


def test_master_addr_that_does_not_resolve():
    code, results = doctor("network.master_addr", env=clean_env({"MASTER_ADDR": "no.such.host"}))
    assert code == 1
    assert_named_failure(results, "network.master_addr", "MASTER_ADDR=no.such.host")


def test_unknown_init_method():
    code, results = doctor("rendezvous", "--init-method", "foo://", env=clean_env())
    assert code == 1
    result = assert_named_failure(results, "rendezvous.init_method", "'foo://'")
    assert "env://, tcp://HOST:PORT or file:///PATH" in result["fix"]
    assert results["rendezvous.file"]["status"] == "skip"


def test_file_rendezvous_under_a_missing_directory(tmp_path):
    url = f"file://{tmp_path}/missing/init"
    code, results = doctor("rendezvous", "--init-method", url, env=clean_env())
    assert code == 1
    assert_named_failure(results, "rendezvous.file", f"{tmp_path}/missing", "does not exist")


def test_file_rendezvous_under_a_read_only_directory():
    url = f"file://{READ_ONLY_DIR}/ddp-init"
    code, results = doctor("rendezvous.file", "--init-method", url, env=clean_env())
    assert code == 1
    assert_named_failure(results, "rendezvous.file", f"cannot create files in {READ_ONLY_DIR}")


def test_stale_rendezvous_file_text_output_shows_the_fix(tmp_path):
    stale = tmp_path / "init"
    stale.write_text("old run")
    cmd = ddpdoctor_cmd("doctor", "rendezvous", "--init-method", f"file://{stale}")
    done = run(cmd, timeout=60, env=clean_env({"NO_COLOR": "1", "COLUMNS": "200"}))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "Rendezvous file: the rendezvous file" in done.stdout
    assert f"fix: Delete it before the launch (rm -f {stale})" in done.stdout
    assert "problems found (exit 1" in done.stdout


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_no_network_at_all():
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root)")
    code, results = doctor("network", env=clean_env(), prefix=("unshare", "-n"))
    assert code == 1
    assert_named_failure(results, "network.interfaces", "no network interface is up")


def test_pyspy_missing_warns_and_fails_under_strict(tmp_path):
    # A Python with no py-spy beside it and a PATH without py-spy: a symlink to the real
    # interpreter, with this environment's packages on PYTHONPATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.symlink_to(os.path.realpath(PYTHON))
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not _has_pyspy(d)
    )
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = clean_env({"PATH": path, "PYTHONPATH": os.pathsep.join([str(REPO), *site])})
    cmd = [str(python), "-m", "ddpdoctor", "doctor", "system.pyspy", "--json"]
    done = run(cmd, timeout=60, env=env)
    result = json.loads(done.stdout)["results"][0]
    assert done.returncode == 0 and result["status"] == "warn"
    assert "py-spy is not installed" in result["summary"] and result["fix"] == "pip install py-spy"
    strict = run([*cmd, "--strict"], timeout=60, env=env)
    assert strict.returncode == 1


def _has_pyspy(directory: str) -> bool:
    return (Path(directory) / "py-spy").exists()


def test_list_checks_names_every_check_of_these_groups():
    done = run(ddpdoctor_cmd("doctor", "--list-checks", "--json"), timeout=60)
    ids = {c["id"] for c in json.loads(done.stdout)["checks"]}
    expected = {
        "network.master_port",
        "network.master_addr",
        "network.hostname",
        "network.interfaces",
        "rendezvous.init_method",
        "rendezvous.file",
        "system.shm",
        "system.limits",
        "system.cpu",
        "system.memory",
        "system.pyspy",
        "smoke.collectives",
    }
    assert done.returncode == 0 and expected <= ids


def test_healthy_groups_pass_on_this_machine():
    code, results = doctor("network", "rendezvous", "system", "--nproc", "1", "--workers", "0")
    assert code == 0
    assert all(r["status"] in ("pass", "skip") for r in results.values()), results


@pytest.mark.timeout(90)
def test_interrupted_doctor_leaves_no_smoke_rank(tmp_path):
    log = tmp_path / "stderr"
    with (
        log.open("w") as err,
        background(
            ddpdoctor_cmd("doctor", "smoke", "--backend", "gloo"),
            env=clean_env({"DDPDOCTOR_SMOKE_FAULT": "hang:rank=1,step=barrier"}),
            stderr=err,
        ) as proc,
    ):
        ranks = wait_for(lambda: _smoke_ranks(proc.pid), timeout=45, what="smoke ranks")
        pids = [p.pid for p in ranks]
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C on the doctor
        code = proc.wait(timeout=30)
        assert code == 130, log.read_text()[-3000:]
    assert "ddpdoctor: error: interrupted" in log.read_text()
    # The doctor ends and reaps its ranks before it exits; the ranks' own guard (exit when the
    # doctor is gone) would leave them alive for a moment after it, which this would catch.
    assert not [p for p in pids if psutil.pid_exists(p) and not _zombie(p)]


def _smoke_ranks(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = [c for c in children if "smoke_worker.py" in " ".join(_cmdline(c))]
    return found if len(found) == 2 else []


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
