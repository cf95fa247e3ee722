"""How `ddpdoctor run -- COMMAND` ends when there was no problem to find, or no rank to watch:
a command whose process never joins a process group, one ddpdoctor cannot load into, an mp.spawn
parent stopped from outside. The verdict, the exit code and the reason, said once."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.procs import PYTHON, REPO, background, ddpdoctor_cmd, free_port, wait_for
from tests.procs import run as run_proc

pytestmark = pytest.mark.integration
JOBS = REPO / "tests" / "launch_jobs"


def ended(tmp_path: Path, *command: str, exit_code: int = 0):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd("run", "--no-doctor", "--no-tui", "--run-dir", str(run_dir), "--", *command)
    done = run_proc(cmd, timeout=120, cwd=tmp_path)
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    return done, diagnosis


def script(tmp_path: Path, code: int) -> str:
    path = tmp_path / "no_process_group.py"
    path.write_text(f"import sys\nprint('trained alone')\nsys.exit({code})\n")
    return str(path)


@pytest.mark.parametrize("code", [0, 3])
def test_a_command_that_never_joins_a_process_group_ends_with_its_own_exit_code(tmp_path, code):
    """Not "NOT STARTED, exit 1": the command ran one process that never joined."""
    done, diagnosis = ended(tmp_path, PYTHON, script(tmp_path, code))
    assert done.returncode == code, done.stdout + done.stderr  # its own code, kept
    assert diagnosis["verdict"] == "not_distributed" and diagnosis["final"] is True
    assert "trained alone" in done.stdout
    reason = "the command ran 1 process that never joined a process group"
    assert done.stdout.count(reason) == 1  # said once, in the headline
    assert f"exited with code {code}" in done.stdout
    assert done.stdout.rstrip().endswith(f"verdict: not distributed (exit code {code})")


RAY_TASKS_ONLY = """\
import sys

import ray


@ray.remote
def square(x):
    return x * x


ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
print("squares", sum(ray.get([square.remote(i) for i in range(4)])))
ray.shutdown()
sys.exit(3)
"""

RAY_IMPORTED_ONLY = """\
from ray import data as _unused  # noqa: F401  (a pipeline that never reached its trainer)


def main() -> int:
    print("prepared alone")
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
"""


def _ray_ended(tmp_path: Path, source: str):
    path = tmp_path / "ray_job.py"
    path.write_text(source)
    done, diagnosis = ended(tmp_path, PYTHON, str(path))
    assert done.returncode == 3, done.stdout + done.stderr  # the job's own code, not 1
    assert diagnosis["verdict"] == "not_distributed", diagnosis
    fix = diagnosis["findings"][0]["fix"]
    assert "TorchTrainer" in fix and "accelerate" not in fix and "torchrun" not in fix, fix
    assert done.stdout.rstrip().endswith("verdict: not distributed (exit code 3)")
    return done


def test_a_script_that_imports_ray_and_never_forms_a_group_keeps_its_exit_code(tmp_path):
    """Style 1: Ray imported at the top, a main() that returns 3 (no cluster started)."""
    done = _ray_ended(tmp_path, RAY_IMPORTED_ONLY)
    assert "prepared alone" in done.stdout


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_ray_tasks_script_keeps_its_exit_code_and_gets_ray_advice(tmp_path):
    """Style 2: a local Ray cluster, remote tasks, ray.shutdown() and sys.exit(3)."""
    done = _ray_ended(tmp_path, RAY_TASKS_ONLY)
    assert "squares 14" in done.stdout


def test_python_dash_i_is_not_instrumented_and_keeps_the_exit_code(tmp_path):
    done, diagnosis = ended(tmp_path, PYTHON, "-I", script(tmp_path, 0))
    assert done.returncode == 0, done.stdout + done.stderr
    assert diagnosis["verdict"] == "not_instrumented"
    reason = (
        "the runtime could not load in this process: python -I (isolated mode) ignores PYTHONPATH"
    )
    assert done.stdout.count(reason) == 1
    assert "NOT STARTED" not in done.stdout
    assert done.stdout.rstrip().endswith("verdict: not instrumented (exit code 0)")


def spawn_parent(guard_pid: int) -> int | None:
    """The mp.spawn parent: the child of ddpdoctor's job guard."""
    try:
        with open(f"/proc/{guard_pid}/task/{guard_pid}/children") as fh:
            children = [int(p) for p in fh.read().split()]
    except OSError:
        return None
    return children[0] if children else None


def guard_of(ddpdoctor_pid: int) -> int | None:
    try:
        with open(f"/proc/{ddpdoctor_pid}/task/{ddpdoctor_pid}/children") as fh:
            for pid in map(int, fh.read().split()):
                with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                    if b"ddpdoctor.launch.job_guard" in cmd.read():
                        return pid
    except OSError:
        return None
    return None


def stepped(run_dir: Path) -> bool:
    path = run_dir / "events" / "rank-1.jsonl"
    return path.exists() and '"kind":"step"' in path.read_text().replace(" ", "")


@pytest.mark.timeout(200)
def test_sigterm_to_an_mp_spawn_parent_is_an_interrupted_run_not_a_healthy_one(tmp_path):
    """torch's children swallow their parent's death signal and exit 0 at step N of 2000; the
    parent died of SIGTERM. Not "HEALTHY: all 2 ranks finished … torchrun exited with -15"."""
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--json", "--run-dir", str(run_dir), "--",
        PYTHON, str(JOBS / "spawn_tcp_hang.py"), str(free_port()), "--steps", "2000",
    )  # fmt: skip
    with background(cmd, cwd=tmp_path) as proc:
        wait_for(lambda: stepped(run_dir), timeout=120, what="rank 1's first step")
        guard = wait_for(lambda: guard_of(proc.pid), timeout=10, what="the job guard")
        parent = wait_for(lambda: spawn_parent(guard), timeout=10, what="the mp.spawn parent")
        os.kill(parent, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    doc = json.loads(out)
    assert doc["verdict"] == "interrupted" and doc["culprits"] == [] and not doc["confirmed"]
    [note] = [f for f in doc["findings"] if f["id"] == "run.launcher_stopped"]
    assert note["summary"].startswith(
        f"the launcher (python {JOBS / 'spawn_tcp_hang.py'}) was ended by SIGTERM from outside"
    )
    assert "the ranks stopped at step " in note["summary"]
    assert "torchrun" not in err.splitlines()[-3] and "HEALTHY" not in err
    assert err.rstrip().endswith("verdict: interrupted (exit code 130)")
