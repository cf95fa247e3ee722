"""The pytest plugin, run for real: pytest on a throwaway project in a subprocess, its outcomes
compared with what `ddpdoctor doctor --json` says for the same checks in the same environment."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.procs import PYTHON, clean_env, ddpdoctor_cmd, run

pytestmark = pytest.mark.integration

CHECKS = "launcher,nccl"
# Planted problems: RANK=-1 fails launcher.env, the NCCL_DEUBG typo warns in nccl.env, and
# launcher.slurm skips outside Slurm. The test below checks these statuses from the doctor itself.
PLANTED = {"RANK": "-1", "NCCL_DEUBG": "INFO"}

FIXTURE_TEST = """
from ddpdoctor.integrations.pytest_plugin import doctor_report


def test_the_fixture_shares_the_one_report(ddp_doctor, request):
    assert ddp_doctor is doctor_report(request.config)
    assert ddp_doctor.by_id("launcher.env").status.value == "fail"


def test_a_project_test():
    assert True
"""

LIGHT_TEST = """
import sys


def test_plugin_loaded_but_idle():
    assert "ddpdoctor.integrations.pytest_plugin" in sys.modules
    assert "ddpdoctor.checks.registry" not in sys.modules
    assert "torch" not in sys.modules
"""


def pytest_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", *args]


def isolated_env(**extra: str) -> dict[str, str]:
    # Only -p loads the plugin: the installed entry point would register it a second time.
    return clean_env({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **extra})


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir
    (tmp_path / "test_fixture.py").write_text(FIXTURE_TEST)
    (tmp_path / "test_light.py").write_text(LIGHT_TEST)
    return tmp_path


def outcomes(junit: Path) -> dict[str, str]:
    """pytest's own JUnit file -> {nodeid: passed|failed|skipped}."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        elif case.find("skipped") is not None:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def doctor_statuses(env: dict[str, str]) -> dict[str, str]:
    finished = run(ddpdoctor_cmd("doctor", *CHECKS.split(","), "--json"), timeout=60, env=env)
    return {r["id"]: r["status"] for r in json.loads(finished.stdout)["results"]}


@pytest.mark.timeout(120)
def test_items_pass_fail_and_skip_as_the_checks_say(project):
    env = isolated_env(**PLANTED)
    statuses = doctor_statuses(env)
    assert {"fail", "warn", "skip", "pass"} <= set(statuses.values()), statuses
    junit = project / "results.xml"
    finished = run(
        pytest_cmd(
            "-p",
            "ddpdoctor.integrations.pytest_plugin",
            "--ddpdoctor",
            f"--ddpdoctor-checks={CHECKS}",
            f"--junitxml={junit}",
            "-rA",
            "test_fixture.py",
        ),
        timeout=90,
        env=env,
        cwd=project,
    )
    assert finished.returncode == 1, finished.stdout[-3000:]
    expected = {"pass": "passed", "warn": "passed", "skip": "skipped", "fail": "failed"}
    got = outcomes(junit)
    assert {k: v for k, v in got.items() if k.startswith("ddpdoctor::")} == {
        f"ddpdoctor::{check}": expected[status] for check, status in statuses.items()
    }
    assert got["test_fixture::test_the_fixture_shares_the_one_report"] == "passed"
    assert got["test_fixture::test_a_project_test"] == "passed"
    out = finished.stdout
    assert f"collected {len(statuses) + 2} items" in out
    assert re.search(r"ddpdoctor::nccl\.env:\d+: DoctorWarning: .*NCCL_DEBUG", out), out[-3000:]
    assert "fix: " in out  # the failing check's fix is in its failure report
    assert "problems found (exit 1" in out  # the doctor's summary line closes the run


@pytest.mark.timeout(120)
def test_strict_fails_warnings_even_without_project_tests(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "results.xml"
    finished = run(
        pytest_cmd(
            "-p",
            "ddpdoctor.integrations.pytest_plugin",
            "--ddpdoctor",
            "--ddpdoctor-strict",
            f"--ddpdoctor-checks={CHECKS}",
            f"--junitxml={junit}",
        ),
        timeout=90,
        env=isolated_env(NCCL_DEUBG="INFO"),
        cwd=tmp_path,
    )
    assert finished.returncode == 1, finished.stdout[-3000:]
    got = outcomes(junit)
    assert got["ddpdoctor::nccl.env"] == "failed"
    assert got["ddpdoctor::launcher.slurm"] == "skipped"
    assert all(name.startswith("ddpdoctor::") for name in got)


@pytest.mark.timeout(120)
def test_installed_plugin_is_idle_without_the_flag_and_works_with_it(project, tmp_path_factory):
    # Autoloaded through the pytest11 entry point, as in any project that installs ddpdoctor.
    idle = run(pytest_cmd("test_light.py"), timeout=90, env=clean_env(), cwd=project)
    assert idle.returncode == 0, idle.stdout[-3000:]
    assert "1 passed" in idle.stdout

    empty = tmp_path_factory.mktemp("empty")
    (empty / "pytest.ini").write_text("[pytest]\n")
    active = run(
        pytest_cmd("--ddpdoctor", "--ddpdoctor-checks=launcher", "--ddpdoctor-no-smoke", "-v"),
        timeout=90,
        env=clean_env(),
        cwd=empty,
    )
    assert active.returncode == 0, active.stdout[-3000:]
    assert "ddpdoctor::launcher.env" in active.stdout
    assert "ready for DDP (exit 0" in active.stdout


@pytest.mark.timeout(60)
def test_unknown_check_is_a_usage_error(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    finished = run(
        pytest_cmd(
            "-p", "ddpdoctor.integrations.pytest_plugin", "--ddpdoctor", "--ddpdoctor-checks=nope"
        ),
        timeout=60,
        env=isolated_env(),
        cwd=tmp_path,
    )
    assert finished.returncode == 4  # pytest's usage-error exit code
    assert "--ddpdoctor-checks: unknown check or group 'nope'" in finished.stderr
