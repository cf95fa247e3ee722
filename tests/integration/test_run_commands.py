"""`ddpdoctor run -- COMMAND`: the user's own launch pattern runs as given and ddpdoctor watches
the ranks it starts: an mp.spawn script (the DDP tutorial's multigpu.py, adapted to CPU), a user's
torchrun (not nested in ddpdoctor's), and srun on the one-host Slurm of `make cluster`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Result, SharedRuns
from tests.procs import (
    PYTHON,
    REPO,
    Finished,
    clean_env,
    ddpdoctor_cmd,
    exited_cleanly_then_aborted,
    free_port,
    job_processes,
)
from tests.procs import run as run_proc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JOBS = Path(__file__).resolve().parent.parent / "launch_jobs"
TUTORIAL = REPO / "tests" / "corpus" / "ddp_tutorial_series"

# pytorch/examples' ddp-tutorial-series/multigpu.py on a machine without GPUs: gloo, the model on
# the CPU, two ranks, and a free port instead of the hard-coded 12355. Nothing else changes.
CPU_ADAPTATION = (
    ("torch.cuda.set_device(rank)", "pass"),
    ('backend="nccl"', 'backend="gloo"'),
    ('os.environ["MASTER_PORT"] = "12355"', 'os.environ["MASTER_PORT"] = os.environ["TEST_PORT"]'),
    ("self.model = model.to(gpu_id)", "self.model = model"),
    ("DDP(model, device_ids=[gpu_id])", "DDP(model)"),
    ("source = source.to(self.gpu_id)", "source = source"),
    ("targets = targets.to(self.gpu_id)", "targets = targets"),
    ("world_size = torch.cuda.device_count()", "world_size = 2"),
    ("pin_memory=True", "pin_memory=False"),
)


def cpu_tutorial(folder: Path) -> Path:
    source = (TUTORIAL / "multigpu.py").read_text()
    for old, new in CPU_ADAPTATION:
        assert old in source, old
        source = source.replace(old, new)
    (folder / "multigpu.py").write_text(source)
    shutil.copy(TUTORIAL / "datautils.py", folder / "datautils.py")
    return folder / "multigpu.py"


def ddpdoctor_run(tmp_path: Path, *command: str, env_extra=None, timeout=240) -> tuple:
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--json", "--run-dir", str(run_dir), "--", *command
    )
    done = run_proc(cmd, timeout=timeout, cwd=tmp_path, env=clean_env(env_extra))
    doc = json.loads(done.stdout) if done.stdout.strip() else None
    return done, doc, run_dir


def event_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "events").glob("*.jsonl"))


def hellos(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == "hello"]


def assert_nothing_left(run_dir: Path) -> None:
    assert job_processes(run_dir) == []


def shared(runs: SharedRuns, name: str) -> tuple[Result, dict | None, Path]:
    """One of the session's shared runs (tests/integration/conftest.py), as ddpdoctor_run gives."""
    done = runs[name]
    return done, (json.loads(done.stdout) if done.stdout.strip() else None), done.run_dir


def explain(done: Finished) -> str:
    return f"rc={done.returncode}\n--- stderr ---\n{done.stderr[-6000:]}"


# -- mp.spawn -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory) -> tuple[Finished, dict | None, Path]:
    """The tutorial under `ddpdoctor run -- python multigpu.py 2 1`, read by two tests."""
    work = tmp_path_factory.mktemp("mp-spawn-tutorial")
    script = cpu_tutorial(work)
    return ddpdoctor_run(
        work, PYTHON, script.name, "2", "1", env_extra={"TEST_PORT": str(free_port())}
    )


def test_mp_spawn_tutorial_is_healthy_with_exactly_its_two_ranks(tutorial):
    done, doc, run_dir = tutorial
    assert done.returncode == 0, explain(done)
    assert doc["verdict"] == "healthy"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["state"] == "done" for r in doc["ranks"])
    assert event_files(run_dir) == ["rank-0.jsonl", "rank-1.jsonl"]  # the parent is no rank
    # the spawned ranks have no WORLD_SIZE: they took it from the process group
    assert hellos(run_dir, 1)[-1]["world_size"] == 2
    [launcher] = doc["launchers"]
    assert launcher["ranks"] == [0, 1] and launcher["argv"][1:] == ["multigpu.py", "2", "1"]
    assert "launcher: python multigpu.py 2 1" in done.stderr
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["launch_mode"] == "command" and run_json["launcher_kind"] == "python"
    assert run_json["torchrun"] is None and run_json["world_size"] is None
    assert "HEALTHY: all 2 ranks finished" in done.stderr
    assert_nothing_left(run_dir)


def test_watch_counts_the_spawned_ranks_not_the_parent(tutorial, tmp_path):
    done, _, ran_in = tutorial
    assert done.returncode == 0, explain(done)
    run_dir = tmp_path / "run"
    shutil.copytree(ran_in, run_dir)  # a copy: watch must not touch the other test's run
    watched = run_proc(ddpdoctor_cmd("watch", str(run_dir), "--json"), timeout=60)
    doc = json.loads(watched.stdout)
    assert doc["verdict"] == "healthy" and len(doc["ranks"]) == 2
    assert doc["launchers"][0]["ranks"] == [0, 1]


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_mp_spawn_tcp_hang_names_the_rank_stops_the_job_and_leaves_nothing(shared_runs):
    # conftest's MP_SPAWN_TCP_HANG: `ddpdoctor run --json -- python spawn_tcp_hang.py PORT
    # --hang-rank 1`, one of the session's shared runs
    done, doc, run_dir = shared(shared_runs, "mp-spawn-tcp-hang")
    assert done.returncode == 1, explain(done)
    assert doc["verdict"] == "hang" and doc["culprits"] == [1], explain(done)
    assert doc["detected_after_s"] <= 20.0  # the default threshold adapts (5 s floor)
    assert doc["job"]["stopped_for"] == "hang"
    culprit_stacks = [s for s in doc["stacks"] if 1 in s["ranks"]]
    assert culprit_stacks and any("spawn_tcp_hang.py" in f for f in culprit_stacks[0]["frames"])
    assert event_files(run_dir) == ["rank-0.jsonl", "rank-1.jsonl"]
    # the parent's ProcessExitedException (a rank ended by the stop) is the stop, not a fault
    assert not [f for f in doc["findings"] if f["id"] == "python.exception"]
    assert_nothing_left(run_dir)


def test_nothing_of_an_mp_spawn_job_outlives_a_killed_ddpdoctor(tmp_path):
    """SIGKILL to `ddpdoctor run`: no atexit, no finally. The guard around the command sees its
    parent die and ends every process below it, the ranks the mp.spawn parent started included."""
    import signal
    import time

    from tests.procs import background, wait_for

    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--run-dir", str(run_dir), "--",
        PYTHON, str(JOBS / "spawn_sleepers.py"), str(free_port()),
    )  # fmt: skip
    with background(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as p:
        wait_for(
            lambda: len(list((run_dir / "events").glob("rank-*.jsonl"))) == 2,
            timeout=120,
            what="both spawned ranks to join",
        )
        assert len(job_processes(run_dir)) >= 4  # guard, mp.spawn parent, 2 ranks
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15  # the guard's grace is 3 s
        while job_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [" ".join(proc.cmdline()) for proc in job_processes(run_dir)]
        for proc in job_processes(run_dir):  # never leak into the suite, even on failure
            proc.kill()
    assert left == []
    # `watch` afterwards: the job was stopped with its launcher, whatever its ranks then did
    # (they exited 0 on a swallowed signal, or died of SIGTERM): never healthy nor a crash
    watched = run_proc(ddpdoctor_cmd("watch", "--json", str(run_dir)), timeout=60, cwd=tmp_path)
    doc = json.loads(watched.stdout)
    assert doc["verdict"] == "interrupted" and doc["culprits"] == [], watched.stdout[-2000:]
    assert doc["findings"][0]["id"] == "run.launcher_killed"


def test_a_script_run_by_the_bootstrap_without_rank_variables_is_no_rank_itself(tmp_path):
    """`python -m ddpdoctor.runtime.bootstrap multigpu.py`: the mp.spawn parent was recorded as
    rank 0 and its two ranks not at all; now the ranks are the two that joined."""
    script = cpu_tutorial(tmp_path)
    run_dir = tmp_path / "run"
    env = clean_env({"TEST_PORT": str(free_port()), "DDPDOCTOR_RUN_DIR": str(run_dir)})
    cmd = [PYTHON, "-m", "ddpdoctor.runtime.bootstrap", script.name, "1", "1"]
    done = run_proc(cmd, timeout=180, cwd=tmp_path, env=env)
    if not exited_cleanly_then_aborted(run_dir, done.stderr, (0, 1)):
        # (torch's teardown aborts a finished rank now and then, with or without ddpdoctor:
        # mp.spawn then raises for it; every rank's events are there all the same)
        assert done.returncode == 0, explain(done)
    assert event_files(run_dir) == ["rank-0.jsonl", "rank-1.jsonl"]
    pids = {hellos(run_dir, r)[-1]["pid"] for r in (0, 1)}
    assert len(pids) == 2 and all(hellos(run_dir, r)[-1]["world_size"] == 2 for r in (0, 1))


# -- a user's torchrun ------------------------------------------------------------------------


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_users_torchrun_is_watched_without_nesting(shared_runs):
    # conftest's "users-torchrun": `ddpdoctor run --json -- python -m torch.distributed.run
    # --standalone --nproc-per-node 2 env_hang.py --steps 10`
    done, doc, run_dir = shared(shared_runs, "users-torchrun")
    assert done.returncode == 0, explain(done)
    assert doc["verdict"] == "healthy" and [r["rank"] for r in doc["ranks"]] == [0, 1]
    # one torchrun (the user's) and its two ranks: the launcher is that torchrun
    [launcher] = doc["launchers"]
    assert launcher["argv"][1:3] == ["-m", "torch.distributed.run"]
    pids = {hellos(run_dir, r)[-1]["ppid"] for r in (0, 1)}
    assert pids == {launcher["pid"]}
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["launcher_kind"] == "torchrun"
    assert run_json["job_command"][:3] == [PYTHON, "-m", "torch.distributed.run"]
    assert_nothing_left(run_dir)


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_hang_under_a_users_torchrun_names_the_rank(shared_runs):
    # conftest's "users-torchrun-hang": as above with --hang-after 2 and env_hang.py's rank 0
    # hanging at step 3
    done, doc, run_dir = shared(shared_runs, "users-torchrun-hang")
    assert done.returncode == 1, explain(done)
    assert doc["verdict"] == "hang" and doc["culprits"] == [0], explain(done)
    assert doc["job"]["stopped_for"] == "hang" and doc["stacks"]
    assert_nothing_left(run_dir)


@pytest.mark.timeout(400)  # the session's shared runs may start here
def test_a_stopped_hang_stays_a_hang_whatever_the_sigterm_handlers_do(shared_runs):
    """conftest's "sigterm-collective-hang": rank 1 hangs before an all_reduce; when ddpdoctor
    stops the job, each rank's SIGTERM handler runs a barrier (as Lightning's does), which,
    diagnosed anew, read as a mismatch. The stop is a consequence; the verdict stays the hang."""
    done, doc, run_dir = shared(shared_runs, "sigterm-collective-hang")
    assert done.returncode == 1, explain(done)
    assert doc["verdict"] == "hang" and doc["culprits"] == [1], explain(done)
    assert doc["job"]["stopped_for"] == "hang"
    assert "verdict: hang (exit code 1)" in done.stderr
    ids = [f["id"] for f in doc["findings"]]
    assert ids[0] == "hang" and "mismatch" not in ids and "crash" not in ids
    stop = next(f for f in doc["findings"] if f["id"] == "crash.consequence")
    assert "ddpdoctor stopped the job" in stop["summary"]
    written = json.loads((run_dir / "diagnosis.json").read_text())
    assert written["stopped_for"] == {"verdict": "hang", "culprits": [1]}
    assert_nothing_left(run_dir)


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--nproc", "2"], "--nproc only apply when ddpdoctor starts torchrun itself"),
        (["--inject", "hang:rank=0"], "--inject only works with the reference job"),
    ],
)
def test_torchrun_flags_with_a_command_are_one_usage_line(tmp_path, flags, message):
    cmd = ddpdoctor_cmd("run", "--no-doctor", *flags, "--", PYTHON, "train.py")
    done = run_proc(cmd, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("ddpdoctor: error: ") and message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_command_not_found_is_one_usage_line(tmp_path):
    cmd = ddpdoctor_cmd("run", "--no-doctor", "--", "no-such-launcher-xyz", "train.py")
    done = run_proc(cmd, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "ddpdoctor: error: command not found: no-such-launcher-xyz (give a training script, "
        "-m MODULE, or a program on PATH)"
    )


# -- srun (make cluster) ----------------------------------------------------------------------


def slurm_up() -> str | None:
    """None when a Slurm node is idle here; else why the slurm tests are skipped."""
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        return "no Slurm here (make cluster provisions a one-host one)"
    try:
        states = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo did not answer: {exc}"
    if states.returncode != 0 or "idle" not in states.stdout.split():
        return f"no idle Slurm node (sinfo: {states.stdout.strip() or states.stderr.strip()})"
    return None


slurm = pytest.mark.skipif(slurm_up() is not None, reason=slurm_up() or "")


@pytest.mark.slurm
@slurm
def test_srun_with_two_tasks_is_healthy_with_slurms_variables_translated(tmp_path):
    done, doc, run_dir = ddpdoctor_run(
        tmp_path, "srun", "-n", "2", PYTHON, str(JOBS / "env_hang.py"), "--steps", "10"
    )
    assert done.returncode == 0, explain(done)
    assert doc["verdict"] == "healthy" and [r["rank"] for r in doc["ranks"]] == [0, 1]
    hello = hellos(run_dir, 1)[-1]
    assert hello["env_from"] == "slurm"
    assert set(hello["env_filled"]) >= {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}
    assert hello["world_size"] == 2 and hello["local_rank"] == 1
    assert doc["launchers"][0]["argv"][0].startswith("slurmstepd")
    assert_nothing_left(run_dir)


@pytest.mark.slurm
@slurm
def test_srun_crash_names_the_rank_that_raised(tmp_path):
    done, doc, run_dir = ddpdoctor_run(
        tmp_path,
        "srun",
        "-n",
        "2",
        "--kill-on-bad-exit=1",
        PYTHON,
        str(JOBS / "crash_step.py"),
        "--crash-rank",
        "1",
    )
    assert done.returncode == 1, explain(done)
    assert doc["verdict"] == "crash" and 1 in doc["culprits"], explain(done)
    assert_nothing_left(run_dir)


@pytest.mark.slurm
@slurm
def test_srun_hang_names_the_rank_and_stops_the_step(tmp_path):
    done, doc, run_dir = ddpdoctor_run(
        tmp_path, "srun", "-n", "2", PYTHON, str(JOBS / "env_hang.py"), "--hang-rank", "1"
    )
    assert done.returncode == 1, explain(done)
    assert doc["verdict"] == "hang" and doc["culprits"] == [1], explain(done)
    assert doc["job"]["stopped_for"] == "hang"
    assert_nothing_left(run_dir)


@pytest.mark.slurm
@slurm
def test_no_slurm_env_leaves_slurms_variables_alone(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--no-slurm-env", "--run-dir", str(run_dir), "--",
        "srun", "-n", "1", PYTHON, "-c", "import os; print('RANK=' + os.environ.get('RANK', '-'))",
    )  # fmt: skip
    done = run_proc(cmd, timeout=120, cwd=tmp_path)
    assert "RANK=-" in done.stdout, explain(done)
