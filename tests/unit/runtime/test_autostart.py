"""The runtime's activation in processes ddpdoctor did not start: the sitecustomize (real
interpreters with it on PYTHONPATH), launcher detection, Slurm's variables, the post-import hook."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from ddpdoctor.protocol.rundir import ENV_RUN_DIR
from ddpdoctor.runtime import autostart
from ddpdoctor.runtime.autostart import (
    ENV_SLURM_ENV,
    SITE_DIR,
    fill_from_slurm,
    is_launcher,
    on_startup,
    when_imported,
)
from ddpdoctor.runtime.info import ENV_FILLED, ENV_FILLED_FROM, env_filled
from tests.procs import REPO, clean_env

SRUN_TASK = {
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_JOB_ID": "4242",
}


def python_with_site(code: str, extra_path: list[str] | None = None, **env: str) -> str:
    path = os.pathsep.join([str(SITE_DIR), *(extra_path or []), str(REPO)])
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env({"PYTHONPATH": path, **env}),
        capture_output=True,
        text=True,
        timeout=180,  # importing torch: seconds quiet, a minute at a load of 30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_outside_a_run_the_sitecustomize_does_nothing_and_hands_over(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    code = "import os, sys; print(os.environ.get('OTHER_SITE'), len(sys.meta_path))"
    plain = subprocess.run(
        [sys.executable, "-c", "import sys; print(len(sys.meta_path))"],
        env=clean_env({"PYTHONPATH": str(REPO)}), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert python_with_site(code, [str(other)]) == f"ran {plain.stdout.strip()}"


def test_in_a_run_it_waits_for_torch_distributed_and_still_chains(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    code = (
        "import os, sys; from ddpdoctor.runtime import autostart; "
        "print(os.environ.get('OTHER_SITE'), "
        "any(isinstance(f, autostart._AfterImport) for f in sys.meta_path))"
    )
    out = python_with_site(code, [str(other)], **{ENV_RUN_DIR: str(tmp_path / "run")})
    assert out == "ran True"


def test_a_process_that_never_joins_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    code = "import torch.distributed as dist; print(dist.init_process_group.__ddpdoctor_join__)"
    assert python_with_site(code, **{ENV_RUN_DIR: str(run_dir)}) == "True"
    assert not (run_dir / "events").exists() or not list((run_dir / "events").iterdir())


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], True),
        (["python", "-u", "-m", "torch.distributed.launch", "t.py"], True),
        (["/venv/bin/python", "/venv/bin/torchrun", "t.py"], True),
        (["python", "/venv/bin/accelerate", "launch", "t.py"], True),
        (["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=x", "t.py"], True),
        (["python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"], True),
        (["python", "t.py"], False),
        (["python", "-m", "pkg.train"], False),
        (
            ["python", "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"],
            False,
        ),
        (["python"], False),
    ],
)
def test_launchers_are_left_alone(argv, launcher):
    assert is_launcher(argv) is launcher


def test_on_startup_needs_a_run_dir_and_skips_launchers(tmp_path, monkeypatch):
    monkeypatch.setattr(autostart, "when_imported", lambda name, callback: None)
    assert not on_startup({}, ["python", "t.py"])
    run = {ENV_RUN_DIR: str(tmp_path)}
    assert on_startup(dict(run), ["python", "t.py"])
    assert not on_startup(dict(run), ["python", "-m", "torch.distributed.run", "t.py"])
    assert not on_startup({**run, "DDPDOCTOR_AUTOSTART": "0"}, ["python", "t.py"])


def test_slurms_variables_fill_torchs_and_say_so():
    env = dict(SRUN_TASK)
    filled = fill_from_slurm(env)
    assert filled == ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")  # fmt: skip
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "1", "2", "1", "2",
    )  # fmt: skip
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node07", str(15000 + 4242))
    assert env_filled(env) == {"env_from": "slurm", "env_filled": list(filled)}
    assert env[ENV_FILLED_FROM] == "slurm" and env[ENV_FILLED].startswith("RANK,")


def test_slurm_mapping_keeps_what_is_set_and_can_be_turned_off():
    env = {**SRUN_TASK, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}
    assert "MASTER_ADDR" not in fill_from_slurm(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("head", "1234")
    assert fill_from_slurm({**SRUN_TASK, "RANK": "0", "WORLD_SIZE": "2"}) == ()  # torchrun's
    off = {**SRUN_TASK, ENV_SLURM_ENV: "0"}
    assert fill_from_slurm(off) == () and "RANK" not in off
    assert fill_from_slurm({"SLURM_JOB_ID": "1"}) == ()  # a batch script, not an srun task
    assert env_filled({}) == {}


def test_a_broken_slurm_environment_is_one_warning_and_no_mapping(capsys):
    env = {**SRUN_TASK, "SLURM_PROCID": "5"}
    assert fill_from_slurm(env) == ()
    assert "RANK" not in env
    assert capsys.readouterr().err.startswith("ddpdoctor: warning: Slurm's variables were not")


def test_when_imported_fires_once_after_the_module_ran(tmp_path, monkeypatch):
    (tmp_path / "late_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[types.ModuleType] = []
    when_imported("late_mod", seen.append)
    import late_mod

    assert [m.VALUE for m in seen] == [41]
    assert late_mod.__loader__.__class__.__name__ != "_CallbackLoader"  # sources stay readable
    assert not any(isinstance(f, autostart._AfterImport) for f in sys.meta_path)
    when_imported("late_mod", seen.append)  # already imported: at once
    assert len(seen) == 2
    monkeypatch.delitem(sys.modules, "late_mod")


@pytest.mark.parametrize(
    ("script", "followed"),
    [
        ("ray/dashboard/agent.py", False),  # Ray's dashboard agent: the raylet waits for it
        ("ray/_private/runtime_env/agent/main.py", False),
        ("ray/_private/log_monitor.py", False),
        ("ray/autoscaler/_private/monitor.py", False),
        ("ray/_private/workers/default_worker.py", True),  # runs the user's code
        ("train.py", True),
    ],
)
def test_rays_own_helpers_do_not_load_the_runtime(tmp_path, script, followed):
    """Ray's helpers are never ranks, and the raylet aborts when its agents start late: they
    skip ddpdoctor's import (on a loaded machine it made the raylet miss its 15 s)."""
    path = tmp_path / "site-packages" / script
    path.parent.mkdir(parents=True)
    path.write_text("import sys\nprint('ddpdoctor.runtime.autostart' in sys.modules)\n")
    done = subprocess.run(
        [sys.executable, "-u", str(path)],
        env=clean_env(
            {"PYTHONPATH": f"{SITE_DIR}{os.pathsep}{REPO}", ENV_RUN_DIR: str(tmp_path / "run")}
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(followed)
