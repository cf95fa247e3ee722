"""The preflight doctor inside `ddpdoctor run`: its options, doctor.json, the stop on a failed fact
about the machine or the launch, and the script checkup's findings, which never stop it."""

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
    refused = preflight(plan, RunDir.create(run_dir), make_console(out, width=200))
    return refused is None, out.getvalue()


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


def script_result(status: Status, line: int = 12) -> CheckResult:
    finding = {
        "id": "script.rank_guard_collective",
        "severity": "error",
        "summary": "dist.barrier() runs only under `if args.debug_fault and rank == 0:`",
        "fix": "call it on every rank",
        "ranks": [],
        "evidence": [{"file": "lit_train.py", "line": line, "text": "dist.barrier()"}],
    }
    return CheckResult(
        id="script.rank_guard_collective",
        group="script",
        title="lit_train.py:12",
        status=status,
        summary=finding["summary"],
        fix="call it on every rank",
        facts={"finding": finding, "rule": finding["id"], "path": "lit_train.py", "line": line},
    )


@pytest.mark.parametrize("status", [Status.FAIL, Status.WARN, Status.ERROR])
def test_the_script_checkups_findings_never_stop_the_run(doctor_returns, tmp_path, status):
    # A static reading cannot know which branch runs: a collective under a debug flag's rank
    # guard is a hang only in a mode the job may never use. Shown, kept, never a refusal.
    doctor_returns(result(Status.PASS), script_result(status))
    ok, text = preflight_of([], tmp_path / "r")
    assert ok
    assert "dist.barrier() runs only under" in text and "call it on every rank" in text
    assert "the job starts" in text and "not started" not in text
    saved = json.loads((tmp_path / "r" / "doctor.json").read_text())
    assert saved["results"][1]["group"] == "script"  # kept for the diagnosis to cite
    assert saved["exit_code"] == (0 if status is Status.WARN else 1)  # doctor --script's code


def test_a_fact_refuses_even_beside_script_findings(doctor_returns, tmp_path):
    doctor_returns(result(Status.FAIL), script_result(Status.FAIL))
    ok, text = preflight_of([], tmp_path / "r")
    assert not ok and "about this machine or launch" in text
