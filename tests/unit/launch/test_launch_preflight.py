"""The preflight doctor inside `ddpdoctor run`: its options, doctor.json, and the stop on a FAIL."""

from __future__ import annotations

import io
import json

import pytest

from ddpdoctor import cli
from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.console import make_console
from ddpdoctor.launch.launcher import preflight
from ddpdoctor.launch.plan import plan_from_args
from ddpdoctor.protocol.rundir import RunDir


def result(status: Status, check_id: str = "network.master_port") -> CheckResult:
    return CheckResult(
        id=check_id,
        group="network",
        title="Master port",
        status=status,
        summary=f"port 29500: {status.value}",
        fix="pick a free port with --master-port" if status is not Status.PASS else None,
    )


@pytest.fixture
def doctor_returns(monkeypatch):
    calls = []

    def install(*results: CheckResult):
        def fake_run_checks(ids=None, *, options=None, **kwargs):
            calls.append((ids, options, kwargs))
            return DoctorReport.build(results)

        monkeypatch.setattr("ddpdoctor.checks.runner.run_checks", fake_run_checks)
        return calls

    return install


def preflight_of(argv, run_dir):
    plan = plan_from_args(cli.parse_args(["run", *argv]), gpu_count=lambda: 0)
    out = io.StringIO()
    ok = preflight(plan, RunDir.create(run_dir), make_console(out, width=200))
    return ok, out.getvalue()


def test_a_failed_check_stops_the_run_with_the_report(doctor_returns, tmp_path):
    calls = doctor_returns(result(Status.PASS, "system.shm"), result(Status.FAIL))
    ok, text = preflight_of(["--nproc", "3", "--backend", "gloo", "--workers", "2"], tmp_path / "r")
    assert not ok
    assert "port 29500: fail" in text and "pick a free port" in text
    assert "the job was not started" in text and "--no-doctor" in text
    saved = json.loads((tmp_path / "r" / "doctor.json").read_text())
    assert saved["counts"]["fail"] == 1 and saved["exit_code"] == 1
    _, options, _ = calls[0]
    assert (options.nproc, options.nnodes, options.backend, options.workers) == (3, 1, "gloo", 2)


def test_warnings_go_on(doctor_returns, tmp_path):
    doctor_returns(result(Status.PASS, "system.shm"), result(Status.WARN))
    ok, text = preflight_of([], tmp_path / "r")
    assert ok and "port 29500: warn" in text
    assert json.loads((tmp_path / "r" / "doctor.json").read_text())["counts"]["warn"] == 1


def test_a_check_that_could_not_run_stops_the_run_like_a_failure(doctor_returns, tmp_path):
    # `--nproc 100000` once made the smoke test "could not run" (too many files) and the launch
    # went on to start 100000 workers: an `error` is no evidence the job can run.
    doctor_returns(result(Status.PASS, "system.shm"), result(Status.ERROR, "smoke.collectives"))
    ok, text = preflight_of([], tmp_path / "r")
    assert not ok
    assert "could not run" in text and "the job was not started" in text


def test_a_one_node_launch_tells_the_port_check_it_picks_its_own_port(doctor_returns, tmp_path):
    calls = doctor_returns(result(Status.PASS))
    preflight_of([], tmp_path / "standalone")
    preflight_of(["--master-port", "29511"], tmp_path / "fixed")
    assert calls[0][1].launcher_picks_port is True  # torchrun --standalone
    assert calls[1][1].launcher_picks_port is False  # a port of the user's: check it
