"""JUnit XML from a doctor report: one testcase per check, parsed back with ElementTree."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.cli import main as cli_main
from ddpdoctor.errors import UsageError
from ddpdoctor.integrations.junit import write_junit

NASTY = "a & b < c > d \"quoted\" 'single' \x1b[31mred\x1b[0m nul\x00 tab\t end"


def report(strict: bool = False) -> DoctorReport:
    results = [
        CheckResult("launcher.env", "launcher", "Rank environment", Status.PASS, "RANK ok"),
        CheckResult(
            "network.master_port",
            "network",
            "Master port",
            Status.FAIL,
            "port 29500 is already in use by pid 41 (python <train.py>)",
            details=("0.0.0.0: Address already in use", NASTY),
            fix="kill 41 && MASTER_PORT=29501",
            duration_s=0.0123,
        ),
        CheckResult(
            "system.cpu", "system", "CPU cores", Status.WARN, "6 busy on 2 cores", fix="fewer"
        ),
        CheckResult("launcher.slurm", "launcher", "Slurm", Status.SKIP, "not inside Slurm"),
        CheckResult(
            "gpu.devices",
            "gpu",
            "GPU devices",
            Status.ERROR,
            "timed out after 5 s",
            fix="rerun with --debug",
        ),
    ]
    return DoctorReport(results=tuple(results), host="vm & co", strict=strict, elapsed_s=1.5)


def parse(path) -> ET.Element:
    return ET.parse(path).getroot()


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name"): case for case in root.iter("testcase")}


def test_one_testcase_per_check_with_group_as_classname(tmp_path):
    path = tmp_path / "doctor.xml"
    write_junit(report(), path)
    root = parse(path)
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    assert (
        suite.get("tests"),
        suite.get("failures"),
        suite.get("errors"),
        suite.get("skipped"),
    ) == (
        "5",
        "1",
        "1",
        "1",
    )
    assert suite.get("hostname") == "vm & co"
    by_name = cases(root)
    assert list(by_name) == [
        "launcher.env",
        "network.master_port",
        "system.cpu",
        "launcher.slurm",
        "gpu.devices",
    ]
    assert by_name["network.master_port"].get("classname") == "network"
    assert by_name["network.master_port"].get("time") == "0.012"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["exit_code"] == "1"


def test_failure_error_skipped_and_warning_elements(tmp_path):
    path = tmp_path / "doctor.xml"
    write_junit(report(), path)
    by_name = cases(parse(path))
    failure = by_name["network.master_port"].find("failure")
    assert failure is not None
    assert failure.get("message") == (
        "Master port: port 29500 is already in use by pid 41 (python <train.py>)"
    )
    assert "fix: kill 41 && MASTER_PORT=29501" in (failure.text or "")
    assert "0.0.0.0: Address already in use" in (failure.text or "")
    # Escaped text comes back intact; characters XML cannot carry become U+FFFD.
    assert "a & b < c > d \"quoted\" 'single' \ufffd[31mred" in (failure.text or "")
    assert "nul\ufffd tab\t end" in (failure.text or "")
    error = by_name["gpu.devices"].find("error")
    assert error is not None and "timed out" in (error.get("message") or "")
    skipped = by_name["launcher.slurm"].find("skipped")
    assert skipped is not None and skipped.get("message") == "Slurm: not inside Slurm"
    warned = by_name["system.cpu"]
    assert warned.find("failure") is None
    assert (warned.findtext("system-out") or "").startswith("warning: 6 busy on 2 cores")
    assert len(list(by_name["launcher.env"])) == 0  # a plain pass


def test_strict_turns_warnings_into_failures(tmp_path):
    path = tmp_path / "strict.xml"
    write_junit(report(strict=True), path)
    root = parse(path)
    assert root.get("failures") == "2"
    failure = cases(root)["system.cpu"].find("failure")
    assert failure is not None and failure.get("type") == "warn"


def test_written_atomically_and_replaces_an_old_file(tmp_path):
    path = tmp_path / "doctor.xml"
    path.write_text("old and broken <")
    write_junit(report(), path)
    parse(path)
    assert os.listdir(tmp_path) == ["doctor.xml"]  # no temp file left behind


@pytest.mark.parametrize("where", ["missing/doctor.xml", "."])
def test_bad_paths_are_usage_errors(tmp_path, where):
    with pytest.raises(UsageError, match="--junit-xml"):
        write_junit(report(), tmp_path / where)


def test_cli_writes_junit_together_with_json(tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "abc")  # a named launcher.env failure
    path = tmp_path / "out.xml"
    code = cli_main(["doctor", "launcher", "--json", "--junit-xml", str(path)])
    document = json.loads(capsys.readouterr().out)
    assert code == document["exit_code"] == 1
    by_name = cases(parse(path))
    assert sorted(by_name) == sorted(r["id"] for r in document["results"])
    for result in document["results"]:
        case = by_name[result["id"]]
        assert case.get("classname") == result["group"]
        assert (case.find("failure") is not None) == (result["status"] == "fail")
        assert (case.find("skipped") is not None) == (result["status"] == "skip")
    assert by_name["launcher.env"].find("failure") is not None


def test_cli_bad_junit_path_is_one_line_exit_2(tmp_path, capsys):
    code = cli_main(["doctor", "launcher", "--junit-xml", str(tmp_path / "no" / "x.xml")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ddpdoctor: error: --junit-xml") and err.count("\n") == 1
