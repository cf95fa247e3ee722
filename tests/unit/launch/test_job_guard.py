"""The job guard ends as the command it runs ended, also when that was SIGKILL (the OOM killer),
and its own failures never read as the user's job's (no traceback in the job's output)."""

from __future__ import annotations

import signal
import sys

import pytest

from ddpdoctor.launch.user_command import guarded_argv
from tests.procs import clean_env
from tests.procs import run as run_proc

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_the_guard_dies_of_the_signal_that_ended_the_command(signum):
    kill_self = f"import os; os.kill(os.getpid(), {int(signum)})"
    done = run_proc(guarded_argv([sys.executable, "-c", kill_self]), timeout=30, env=clean_env())
    assert done.returncode == -signum, done.stderr
    assert "Traceback" not in done.stderr and "job_guard.py" not in done.stderr


@pytest.mark.parametrize("code", [0, 3, 77])
def test_the_guard_exits_with_the_commands_code(code):
    done = run_proc(
        guarded_argv([sys.executable, "-c", f"raise SystemExit({code})"]),
        timeout=30,
        env=clean_env(),
    )
    assert done.returncode == code
    assert done.stderr == ""


def test_an_internal_failure_of_the_guard_is_one_line_of_ddpdoctors(monkeypatch, capsys):
    from ddpdoctor.launch import job_guard

    def broken(_argv):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(job_guard, "main", broken)
    assert job_guard.guarded_main(["true"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("ddpdoctor: internal error in the job guard: OSError")
    assert err.count("\n") == 1 and "Traceback" not in err
