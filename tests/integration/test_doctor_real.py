"""The network, rendezvous and smoke checks against the real machine: a port this test holds, file
rendezvous in real directories, and real gloo ranks (healthy, hung, dead, wrong)."""

from __future__ import annotations

import os
import socket
import time

import psutil
import pytest

from ddpdoctor.checks import network, rendezvous, smoke
from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.probes.fs import RealFsProbe
from ddpdoctor.checks.probes.smoke import RealSmokeProbe
from ddpdoctor.checks.probes.smoke_model import SmokeRequest, blame
from tests.procs import clean_env

pytestmark = pytest.mark.integration

READ_ONLY_DIR = "/sys/kernel"  # sysfs refuses new files even to root, unlike chmod 555


def ctx(env=None, **options) -> CheckContext:
    return CheckContext(env=env if env is not None else {}, options=DoctorOptions(**options))


def smoke_workers_of(pid: int) -> list[psutil.Process]:
    """Live processes running the smoke worker that this process started."""
    found = []
    for proc in psutil.process_iter(["ppid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if proc.info["ppid"] == pid and "smoke_worker.py" in cmdline:
            found.append(proc)
    return found


def assert_all_gone(pids) -> None:
    deadline = time.monotonic() + 5
    alive = [p for p in pids if psutil.pid_exists(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if psutil.pid_exists(p) and not _zombie(p)]
    assert not alive, f"smoke ranks left behind: {alive}"
    assert not smoke_workers_of(os.getpid())


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- a port really in use -------------------------------------------------------------------------


def test_a_port_held_by_this_test_fails_naming_this_process():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        result = network.master_port(ctx({"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1"}))
    assert result.status is Status.FAIL
    assert f"port {port} is already in use by pid {os.getpid()}" in result.summary
    assert "python" in result.summary  # the holder's command line (pytest, or its worker)
    assert f"kill {os.getpid()}" in result.fix
    assert network.master_port(ctx({"MASTER_PORT": str(port)})).status is Status.PASS


# --- file rendezvous in real directories ----------------------------------------------------------


def test_clean_file_rendezvous_passes_with_real_fs_facts(tmp_path):
    result = rendezvous.rendezvous_file(ctx(init_method=f"file://{tmp_path}/init"))
    assert result.status is Status.PASS, result.summary
    assert result.facts["lock_ok"] is True
    assert result.facts["fs_type"] and result.facts["mount_point"]
    assert list(tmp_path.iterdir()) == []  # the write and lock tests leave nothing behind


def test_stale_file_fails(tmp_path):
    stale = tmp_path / "init"
    stale.write_bytes(b"\x00" * 64)
    result = rendezvous.rendezvous_file(ctx(init_method=f"file://{stale}"))
    assert result.status is Status.FAIL
    assert "already exists (64 bytes" in result.summary and f"rm -f {stale}" in result.fix


def test_missing_directory_fails(tmp_path):
    result = rendezvous.rendezvous_file(ctx(init_method=f"file://{tmp_path}/no/dir/init"))
    assert result.status is Status.FAIL and "does not exist" in result.summary


def test_read_only_directory_fails():
    if RealFsProbe().dir_status(READ_ONLY_DIR).writable:
        pytest.skip(f"{READ_ONLY_DIR} is writable here")
    result = rendezvous.rendezvous_file(ctx(init_method=f"file://{READ_ONLY_DIR}/ddp-init"))
    assert result.status is Status.FAIL
    assert f"cannot create files in {READ_ONLY_DIR}" in result.summary


# --- the smoke test on real gloo ranks ------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy_smoke():
    context = ctx(clean_env(), nproc=2, backend="gloo")
    start = time.monotonic()
    result = smoke.collectives(context)
    return result, time.monotonic() - start


@pytest.mark.timeout(120)
def test_two_gloo_ranks_pass_with_bandwidth(healthy_smoke):
    result, _ = healthy_smoke
    assert result.status is Status.PASS, (result.summary, result.details)
    assert result.facts["backend"] == "gloo" and result.facts["world_size"] == 2
    sweep = result.facts["sweep"]
    assert [row["bytes"] for row in sweep] == [8, 1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20]
    for row in sweep:
        algbw = row["bytes"] / (row["time_us"] / 1e6) / 1e9
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=0.01, abs=1e-4)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"], rel=0.01, abs=1e-4)  # n=2
    assert result.facts["peak_busbw_gbps"] > 0
    assert "busbw" in result.details[0]


@pytest.mark.timeout(120)
def test_healthy_smoke_leaves_no_process(healthy_smoke):
    result, _ = healthy_smoke
    assert len(result.facts["pids"]) == 2
    assert_all_gone(result.facts["pids"])


def faulty_run(fault: str):
    request = SmokeRequest(
        nproc=2,
        backend="gloo",
        env=clean_env({"DDPDOCTOR_SMOKE_FAULT": fault}),
        timeout_s=60.0,
        init_timeout_s=45.0,
        step_timeout_s=3.0,
        sweep_timeout_s=10.0,
    )
    start = time.monotonic()
    report = RealSmokeProbe().run(request)
    return report, time.monotonic() - start


@pytest.mark.timeout(90)
def test_a_hung_rank_is_named_killed_and_bounded():
    report, elapsed = faulty_run("hang:rank=1,step=all_reduce")
    outcome = smoke.outcome_from_report(report)
    assert outcome.status is Status.FAIL
    assert "rank 1 never started all_reduce (last finished: barrier)" in outcome.summary
    assert "rank 0 was waiting in all_reduce" in outcome.details
    assert outcome.facts["culprit_ranks"] == [1]
    assert report.timed_out_step == "all_reduce"
    # import (a few seconds on a busy machine) + the 3 s step deadline + the kill
    assert elapsed < 45
    assert_all_gone(report.pids())


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("fault", "summary"),
    [
        (
            "die:rank=1,step=broadcast",
            "rank 1 exited with code 3 after all_reduce (before broadcast)",
        ),
        ("wrong:rank=0,step=all_gather", "rank 0 got a wrong result in all_gather: element 515"),
    ],
)
def test_a_dead_or_wrong_rank_is_named(fault, summary):
    report, _ = faulty_run(fault)
    found = blame(report)
    outcome = smoke.outcome_from_report(report)
    assert outcome.status is Status.FAIL
    assert outcome.summary.startswith(summary), outcome.summary
    assert found is not None and found.ranks == (int(fault.split("rank=")[1][0]),)
    assert_all_gone(report.pids())


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_nccl_smoke_on_real_gpus():
    result = smoke.collectives(ctx(clean_env(), backend="nccl"))
    assert result.status is Status.PASS, (result.summary, result.details)
    assert result.facts["backend"] == "nccl" and result.facts["world_size"] >= 1
    assert all(row["algbw_gbps"] > 0 for row in result.facts["sweep"])
    assert_all_gone(result.facts["pids"])
