"""CLI contract: one error line, documented exit codes, --version, no traceback without --debug."""

from __future__ import annotations

import pytest

from ddpdoctor import cli
from ddpdoctor.exit_codes import ExitCode


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.startswith("ddpdoctor ")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["doctor", "--nproc", "zero"],
        ["doctor", "--backend", "mpi"],
        ["watch"],
        ["doctor", "--", "train.py"],
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: ")
    assert "Traceback" not in err


def test_run_splits_the_user_script_after_double_dash():
    args = cli.parse_args(["run", "--nproc", "2", "--", "train.py", "--lr", "0.1", "--"])
    assert args.script == "train.py"
    assert args.script_args == ["--lr", "0.1", "--"]
    assert args.nproc == 2


def test_internal_errors_exit_3_with_one_line(capsys, monkeypatch):
    def explode(_argv):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "parse_args", explode)
    code, _, err = run_cli(capsys, "doctor")
    assert code == ExitCode.INTERNAL
    assert err.strip().startswith("ddpdoctor: error: internal error: ZeroDivisionError: boom")
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys, monkeypatch):
    def explode(_argv):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "parse_args", explode)
    code, _, err = run_cli(capsys, "--debug", "doctor")
    assert code == ExitCode.INTERNAL and "Traceback" in err


def test_ctrl_c_is_130(capsys, monkeypatch):
    def interrupt(_argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "parse_args", interrupt)
    code, _, err = run_cli(capsys, "doctor")
    assert code == ExitCode.INTERRUPTED and err.startswith("ddpdoctor: error: interrupted")
