"""`ddpdoctor doctor --script FILE`: the script group in text, JSON and JUnit, and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor import cli
from ddpdoctor.launch.plan import LaunchPlan

CORPUS = Path(__file__).resolve().parents[3] / "tests" / "corpus"
BROKEN = str(CORPUS / "broken" / "shuffle_with_sampler.py")
# the tutorial with its CPU changes: clean on any machine (the GPU original fails the
# checkup where no GPU is visible, see test_scriptcheck_gpu.py)
CLEAN = str(CORPUS / "run" / "multigpu_torchrun.py")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_script_group_and_exit_1_on_an_error(capsys, tmp_path) -> None:
    junit = tmp_path / "doctor.xml"
    argv = ["doctor", "launcher", "--script", BROKEN, "--script", CLEAN, "--json", "--no-smoke"]
    code, out, err = run_cli(capsys, *argv, "--junit-xml", str(junit))
    report = json.loads(out)
    assert code == 1 == report["exit_code"] and "Traceback" not in err
    groups = {r["group"] for r in report["results"]}
    assert groups == {"launcher", "script"}  # the named checks and the script checkup both ran
    script = [r for r in report["results"] if r["group"] == "script"]
    assert [(r["id"], r["status"], r["title"]) for r in script] == [
        ("script.shuffle_with_sampler", "fail", f"{BROKEN}:9"),
        ("script.checkup", "pass", CLEAN),
    ]
    finding = script[0]["facts"]["finding"]
    assert finding["evidence"][0] == {
        "file": BROKEN,
        "line": 9,
        "text": finding["evidence"][0]["text"],
    }
    assert "script.shuffle_with_sampler" in junit.read_text()


def test_text_names_file_line_rule_and_fix(capsys) -> None:
    code, out, _ = run_cli(capsys, "doctor", "launcher", "--script", BROKEN, "--no-smoke")
    assert code == 1
    assert "Script checkup" in out
    assert f"{BROKEN}:9" in out and "[script.shuffle_with_sampler]" in out
    assert "fix: drop shuffle=True" in out


def test_clean_script_passes(capsys) -> None:
    _code, out, _ = run_cli(capsys, "doctor", "launcher", "--script", CLEAN, "--json")
    script = [r for r in json.loads(out)["results"] if r["group"] == "script"]
    assert [(r["id"], r["status"]) for r in script] == [("script.checkup", "pass")]


def test_missing_script_is_a_usage_error(capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, "doctor", "--script", str(tmp_path / "nope.py"), "--json")
    assert code == 2 and out == ""
    assert err.startswith("ddpdoctor: error: --script") and "Traceback" not in err


def test_syntax_error_is_a_fail_naming_file_and_line(capsys) -> None:
    path = str(CORPUS / "broken" / "syntax_error.py")
    code, out, _ = run_cli(capsys, "doctor", "launcher", "--script", path, "--json")
    [result] = [r for r in json.loads(out)["results"] if r["group"] == "script"]
    assert code == 1 and result["status"] == "fail" and result["title"] == f"{path}:4"


def test_run_checks_the_users_python_script_only() -> None:
    assert LaunchPlan(1, 1, "gloo", script="train.py").checkup_scripts == ("train.py",)
    assert LaunchPlan(1, 1, "gloo").checkup_scripts == ()
    assert LaunchPlan(1, 1, "gloo", script="-m", script_args=("pkg",)).checkup_scripts == ()
