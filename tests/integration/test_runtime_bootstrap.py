"""The bootstrap runs a script exactly as python would, and a rank's process ends leave the
right trail: exit codes, error and exit events, signals. Real processes, without torchrun.

A `torch` package that refuses to import is put first on PYTHONPATH where a test needs the
runtime active but not torch's import time: the runtime then records without torch hooks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ddpdoctor.protocol.events import parse_event_line
from tests.procs import PYTHON, background, clean_env, run, wait_for

pytestmark = pytest.mark.integration

BOOTSTRAP = [PYTHON, "-m", "ddpdoctor.runtime.bootstrap"]

INTROSPECT = """
import json, os, sys
import helper  # a module next to the script
print(json.dumps({
    "name": __name__,
    "file": __file__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "helper": helper.VALUE,
    "main_is_me": sys.modules["__main__"].__dict__ is globals(),
    "spec": getattr(__spec__, "name", None),
    "loader": type(__loader__).__name__,
    "package": __package__,
    "guarded": __name__ == "__main__",
}))
"""


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def project(tmp_path):
    """A script folder, a working directory elsewhere, and a torch that refuses to import."""
    scripts = tmp_path / "proj"
    write(scripts / "helper.py", "VALUE = 42\n")
    write(tmp_path / "no_torch" / "torch" / "__init__.py", "raise ImportError('hidden')\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return scripts, cwd


def env_for(tmp_path, *, run_dir=None, hide_torch=False, rank="0"):
    extra = {"RANK": rank}
    if run_dir is not None:
        extra["DDPDOCTOR_RUN_DIR"] = str(run_dir)
        extra["DDPDOCTOR_HEARTBEAT_S"] = "0.1"
    if hide_torch:
        extra["PYTHONPATH"] = str(tmp_path / "no_torch")
    return clean_env(extra)


def events_of(run_dir, rank=0):
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    return [e for e in map(parse_event_line, path.read_bytes().split(b"\n")) if e]


def test_runs_a_script_exactly_as_python_does(project, tmp_path):
    scripts, cwd = project
    script = write(scripts / "train.py", INTROSPECT)
    args = ["../proj/train.py", "--lr", "0.1"]
    plain = run([PYTHON, *args], timeout=60, cwd=cwd, env=env_for(tmp_path))
    booted = run([*BOOTSTRAP, *args], timeout=60, cwd=cwd, env=env_for(tmp_path))
    assert booted.returncode == plain.returncode == 0, booted.stderr
    assert json.loads(booted.stdout) == json.loads(plain.stdout)
    seen = json.loads(booted.stdout)
    assert seen["argv"] == ["../proj/train.py", "--lr", "0.1"]
    assert os.path.normpath(seen["file"]) == str(script)
    assert seen["name"] == "__main__" and seen["guarded"]
    assert seen["path0"] == str(scripts) and seen["helper"] == 42 and seen["main_is_me"]


def test_runs_a_module_as_python_dash_m_does(project, tmp_path):
    scripts, _ = project
    write(scripts / "pkg" / "__init__.py", "")
    write(
        scripts / "pkg" / "train.py", INTROSPECT.replace("import helper", "from pkg import helper")
    )
    write(scripts / "pkg" / "helper.py", "VALUE = 7\n")
    plain = run([PYTHON, "-m", "pkg.train", "a"], timeout=60, cwd=scripts, env=env_for(tmp_path))
    booted = run(
        [*BOOTSTRAP, "-m", "pkg.train", "a"], timeout=60, cwd=scripts, env=env_for(tmp_path)
    )
    assert booted.returncode == plain.returncode == 0, booted.stderr
    assert json.loads(booted.stdout) == json.loads(plain.stdout)
    assert json.loads(booted.stdout)["package"] == "pkg"


def test_exit_codes_and_tracebacks_match_python(project, tmp_path):
    scripts, cwd = project
    write(scripts / "exit3.py", "import sys\nsys.exit(3)\n")
    write(scripts / "boom.py", "def f():\n    raise KeyError('no such column')\nf()\n")
    write(scripts / "message.py", "raise SystemExit('fatal: no data')\n")
    for name in ("exit3.py", "boom.py", "message.py"):
        path = str(scripts / name)
        plain = run([PYTHON, path], timeout=60, cwd=cwd, env=env_for(tmp_path))
        booted = run([*BOOTSTRAP, path], timeout=60, cwd=cwd, env=env_for(tmp_path))
        assert (booted.returncode, booted.stderr) == (plain.returncode, plain.stderr), name
    assert "bootstrap" not in booted.stderr


def test_spawned_children_find_the_scripts_main_module(project, tmp_path):
    scripts, cwd = project
    script = write(
        scripts / "spawner.py",
        """
        import multiprocessing as mp
        import helper

        def square(x):
            return x * x + helper.VALUE

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(square, [1, 2, 3]))
        """,
    )
    booted = run([*BOOTSTRAP, str(script)], timeout=60, cwd=cwd, env=env_for(tmp_path))
    assert booted.returncode == 0, booted.stderr
    assert booted.stdout.strip() == "[43, 46, 51]"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["missing.py", "--lr", "1"],
            "ddpdoctor: error: cannot run script 'missing.py': no such file",
        ),
        ([], "ddpdoctor: error: usage: python -m ddpdoctor.runtime.bootstrap"),
        (["-m"], "ddpdoctor: error: -m needs a module name"),
        (["-m", "no_such_pkg.train"], "ddpdoctor: error: cannot run module 'no_such_pkg.train'"),
    ],
)
def test_bad_targets_are_one_error_line_and_exit_2(tmp_path, argv, message):
    result = run([*BOOTSTRAP, *argv], timeout=60, cwd=tmp_path, env=env_for(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_exit_events_follow_how_the_script_ended(project, tmp_path):
    scripts, cwd = project
    cases = {
        "ok.py": ("print('done')\n", 0, (0, "normal")),
        "exit3.py": ("import sys\nsys.exit(3)\n", 3, (3, "sys.exit")),
        "boom.py": ("raise KeyError('no such column')\n", 1, (1, "exception")),
        "hard.py": ("import os\nos._exit(5)\n", 5, None),
    }
    for name, (source, returncode, expected) in cases.items():
        run_dir = tmp_path / f"run-{name}"
        write(scripts / name, source)
        env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
        result = run([*BOOTSTRAP, str(scripts / name)], timeout=60, cwd=cwd, env=env)
        assert result.returncode == returncode, result.stderr
        events = events_of(run_dir)
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "hello" and events[0]["script"] == str(scripts / name)
        if expected is None:
            assert "exit" not in kinds  # os._exit: the absence says the rank died
            continue
        assert kinds[-1] == "exit"
        assert (events[-1]["code"], events[-1]["reason"]) == expected
        if name == "boom.py":
            (error,) = [e for e in events if e["kind"] == "error"]
            assert error["exc_type"] == "KeyError" and "no such column" in error["traceback"]
            assert error["location"]["file"] == str(scripts / name)
            assert "bootstrap.py" not in error["traceback"]


BLOCKERS = {
    # the main thread runs Python now and then: the signal handler itself writes the event
    "python": "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n",
    # the main thread sits in C and never returns to Python (as in a hung collective): only the
    # wakeup-fd thread can see the signal
    "c": (
        "import ctypes\nprint('ready', flush=True)\nctypes.CDLL(None).system(b'exec sleep 60')\n"
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocked_in", sorted(BLOCKERS))
def test_sigterm_writes_an_exit_event_then_dies_of_it(project, tmp_path, blocked_in):
    scripts, cwd = project
    script = write(scripts / "block.py", BLOCKERS[blocked_in])
    run_dir = tmp_path / "run"
    env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
    with background([*BOOTSTRAP, str(script)], cwd=cwd, env=env) as proc:
        assert proc.stdout.readline().strip() == "ready"
        wait_for(lambda: len(events_of(run_dir)) >= 2, timeout=20, what="heartbeats")
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM  # died of the signal, as without us
    events = events_of(run_dir)
    assert events[-1]["kind"] == "exit"
    assert (events[-1]["code"], events[-1]["reason"], events[-1]["signal"]) == (
        -15,
        "signal",
        "SIGTERM",
    )


@pytest.mark.timeout(60)
def test_sigkill_leaves_no_exit_event(project, tmp_path):
    scripts, cwd = project
    script = write(scripts / "block.py", BLOCKERS["python"])
    run_dir = tmp_path / "run"
    env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
    with background([*BOOTSTRAP, str(script)], cwd=cwd, env=env) as proc:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=20) == -signal.SIGKILL
    assert next(e["kind"] for e in events_of(run_dir)) == "hello"
    assert "exit" not in [e["kind"] for e in events_of(run_dir)]


@pytest.mark.timeout(60)
def test_a_users_own_sigterm_handler_is_left_alone(project, tmp_path):
    scripts, cwd = project
    script = write(
        scripts / "graceful.py",
        """
        import signal, sys, time
        stop = []
        signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
        print("ready", flush=True)
        while not stop:
            time.sleep(0.05)
        print("saved checkpoint", flush=True)
        sys.exit(0)
        """,
    )
    run_dir = tmp_path / "run"
    env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
    # the runtime is active before the script installs its handler: the script's wins
    with background([*BOOTSTRAP, str(script)], cwd=cwd, env=env) as proc:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stdout.read().strip() == "saved checkpoint"
    assert (events_of(run_dir)[-1]["code"], events_of(run_dir)[-1]["reason"]) == (0, "sys.exit")


def test_dataloader_style_fork_children_write_nothing(project, tmp_path):
    scripts, cwd = project
    script = write(
        scripts / "forker.py",
        """
        import os, sys
        pid = os.fork()
        if pid == 0:
            try:
                raise RuntimeError("in the child")
            except RuntimeError:
                sys.excepthook(*sys.exc_info())
            os._exit(0)
        os.waitpid(pid, 0)
        """,
    )
    run_dir = tmp_path / "run"
    env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
    result = run([*BOOTSTRAP, str(script)], timeout=60, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    assert "in the child" in result.stderr  # the child still printed its error
    events = events_of(run_dir)
    assert "error" not in [e["kind"] for e in events]  # but only the rank writes events
    assert {e["pid"] for e in events if e["kind"] == "hello"} == {result_pid(events)}


def result_pid(events):
    return next(e["pid"] for e in events if e["kind"] == "hello")


def test_the_runtime_does_not_slow_a_plain_import(tmp_path):
    # importing ddpdoctor's runtime must not import torch (the doctor and the CLI load it)
    code = "import sys, ddpdoctor.runtime, ddpdoctor.runtime.api; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "False", result.stderr


def test_a_fatal_signal_prints_every_threads_stack_and_leaves_no_exit_event(project, tmp_path):
    scripts, cwd = project
    script = write(
        scripts / "segv.py",
        """
        import ctypes

        def read_bad_pointer():
            return ctypes.string_at(0)

        read_bad_pointer()
        """,
    )
    run_dir = tmp_path / "run"
    env = env_for(tmp_path, run_dir=run_dir, hide_torch=True)
    result = run([*BOOTSTRAP, str(script)], timeout=60, cwd=cwd, env=env)
    assert result.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in result.stderr
    assert "read_bad_pointer" in result.stderr  # faulthandler's stack of the main thread
    assert "ddpdoctor-heartbeat" in result.stderr or "Thread 0x" in result.stderr
    assert "exit" not in [e["kind"] for e in events_of(run_dir)]
