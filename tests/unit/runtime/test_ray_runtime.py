"""The runtime's Ray parts: the runtime-env hook that brings ddpdoctor to a Ray job's workers
(ray_env) and the tracking of the user's calls in a Ray worker (ray_worker)."""

from __future__ import annotations

import sys
import types

import pytest

from ddpdoctor.launch.user_command import command_env
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.runtime import ray_env, ray_worker
from ddpdoctor.runtime.autostart import SITE_DIR
from tests.runtime_helpers import events

SITE = str(SITE_DIR)


def test_the_hook_adds_the_run_dir_and_the_site_dir_before_the_clusters_pythonpath():
    env = {"DDPDOCTOR_RUN_DIR": "/runs/r1", "DDPDOCTOR_LAUNCH_ID": "1-abc", "HOME": "/root"}
    out = ray_env.with_ddpdoctor(None, env)
    assert out["env_vars"]["DDPDOCTOR_RUN_DIR"] == "/runs/r1"
    assert out["env_vars"]["DDPDOCTOR_LAUNCH_ID"] == "1-abc"
    assert "HOME" not in out["env_vars"]  # only ddpdoctor's own variables travel
    assert out["env_vars"]["PYTHONPATH"] == f"{SITE}:${{PYTHONPATH}}"
    assert out["env_vars"][ray_env.ENV_RAY_PYTHONPATH] == "1"


def test_the_jobs_own_runtime_env_wins_and_keeps_its_other_fields():
    given = {
        "working_dir": ".",
        "env_vars": {"PYTHONPATH": "/mine", "DDPDOCTOR_HEARTBEAT_S": "2", "X": "1"},
    }
    out = ray_env.with_ddpdoctor(given, {"DDPDOCTOR_HEARTBEAT_S": "1", "DDPDOCTOR_RUN_DIR": "/r"})
    assert out["working_dir"] == "."
    assert out["env_vars"]["DDPDOCTOR_HEARTBEAT_S"] == "2"
    assert out["env_vars"]["X"] == "1"
    assert out["env_vars"]["PYTHONPATH"] == f"{SITE}:/mine"
    assert ray_env.ENV_RAY_PYTHONPATH not in out["env_vars"]
    assert given["env_vars"]["PYTHONPATH"] == "/mine"  # the caller's dict is left alone


def test_ddpdoctor_run_sets_the_hook_and_keeps_the_users_to_chain(tmp_path):
    plain = command_env({}, run_dir=RunDir(tmp_path), backend="gloo", torch_version=None)
    assert plain["RAY_RUNTIME_ENV_HOOK"] == ray_env.HOOK_NAME
    assert ray_env.ENV_USER_HOOK not in plain
    users = command_env(
        {"RAY_RUNTIME_ENV_HOOK": "mypkg.hooks.rewrite"},
        run_dir=RunDir(tmp_path),
        backend="gloo",
        torch_version=None,
    )
    assert users["RAY_RUNTIME_ENV_HOOK"] == ray_env.HOOK_NAME
    assert users[ray_env.ENV_USER_HOOK] == "mypkg.hooks.rewrite"


def test_the_users_hook_runs_first(monkeypatch):
    module = types.ModuleType("users_ray_hook")
    module.rewrite = lambda env: {**(env or {}), "env_vars": {"FROM_USER": "1"}}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "users_ray_hook", module)
    monkeypatch.setenv(ray_env.ENV_USER_HOOK, "users_ray_hook.rewrite")
    monkeypatch.setenv("DDPDOCTOR_RUN_DIR", "/r")
    out = ray_env.runtime_env_hook({"pip": ["x"]})
    assert out is not None
    assert out["pip"] == ["x"]
    assert out["env_vars"]["FROM_USER"] == "1"
    assert out["env_vars"]["DDPDOCTOR_RUN_DIR"] == "/r"
    assert ray_env.ENV_USER_HOOK not in out["env_vars"]


def test_a_ray_worker_is_known_by_its_command_line():
    worker = ["/venv/bin/python", "/venv/lib/ray/_private/workers/default_worker.py", "--x=1"]
    assert ray_worker.is_ray_worker(worker)
    assert not ray_worker.is_ray_worker(["python", "train.py", "default_worker.py"])


def test_a_tracked_call_says_busy_then_idle(recording):
    def train(steps):
        return "done"

    assert ray_worker.tracked("train", train)(3) == "done"
    calls = events(recording, "ray_call")
    assert [(e["state"], e["call"]) for e in calls] == [("busy", "train"), ("idle", "train")]
    assert calls[-1]["ok"] is True
    assert not ray_worker.busy()


def test_an_exception_in_a_tracked_call_is_the_ranks_error(recording):
    def train():
        raise ValueError("bad batch")

    with pytest.raises(ValueError):
        ray_worker.tracked("train", train)()
    errors = events(recording, "error")
    assert errors and errors[-1]["exc_type"].endswith("ValueError")
    assert errors[-1]["fatal"] is True
    assert events(recording, "ray_call")[-1]["ok"] is False


def test_nested_calls_are_busy_until_the_outer_returns(recording):
    inner = ray_worker.tracked("inner", lambda: ray_worker.busy())
    outer = ray_worker.tracked("outer", lambda: inner())
    assert outer() is True
    states = [e["state"] for e in events(recording, "ray_call")]
    assert states == ["busy", "idle"]


def test_the_hook_ray_loads_never_fails_where_ddpdoctor_cannot_be_imported(tmp_path):
    """An interpreter without ddpdoctor (python -S: no site-packages) still imports the hook from
    the sitecustomize folder; only the user's own hook runs then."""
    import subprocess

    (tmp_path / "users_hook.py").write_text(
        "def rewrite(env):\n    return {**(env or {}), 'from_user': True}\n"
    )
    code = (
        "import importlib, os\n"
        "name = os.environ['RAY_RUNTIME_ENV_HOOK']\n"
        "module, _, attr = name.rpartition('.')\n"
        "print(getattr(importlib.import_module(module), attr)({'pip': ['x']}))\n"
    )
    env = {
        "PYTHONPATH": f"{SITE}:{tmp_path}",
        "RAY_RUNTIME_ENV_HOOK": ray_env.HOOK_NAME,
        "DDPDOCTOR_RAY_USER_HOOK": "users_hook.rewrite",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'pip': ['x'], 'from_user': True}"


def test_the_actors_class_comes_from_the_title_ray_gives_the_process():
    from ddpdoctor.runtime.ray_identity import actor_class_from_title

    assert actor_class_from_title("ray::RayTrainWorker.execute") == "RayTrainWorker"
    assert actor_class_from_title("ray::TrainWorker") == "TrainWorker"
    assert actor_class_from_title("ray::IDLE") is None
    assert actor_class_from_title("/usr/bin/python train.py") is None


def test_the_actors_class_comes_first_from_rays_table_of_the_actor_in_the_process():
    from ddpdoctor.runtime.ray_identity import actor_class_of_worker

    class RayTrainWorker:
        pass

    class Worker:
        def __init__(self, actors: dict) -> None:
            self.actors = actors

    assert actor_class_of_worker(Worker({"a1": RayTrainWorker()})) == "RayTrainWorker"
    assert actor_class_of_worker(Worker({})) is None
    assert actor_class_of_worker(None) is None
