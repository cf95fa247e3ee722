"""Ray's runtime-env hook: how ddpdoctor's runtime reaches every Ray worker of a job.

A Ray job's ranks are not children of the command ddpdoctor runs: the raylet starts them. A local
cluster started by `ray.init()` inherits the driver's environment, a running cluster
(`ray start --head`, then the job with RAY_ADDRESS) does not. Ray's own way to give a job's
workers an environment is the job's `runtime_env`, and its way to rewrite that on the driver is
the runtime-env hook ($RAY_RUNTIME_ENV_HOOK, a "module.function" called by `ray.init()` with the
runtime_env given, returning the one to use).

`ddpdoctor run -- COMMAND` sets $RAY_RUNTIME_ENV_HOOK to `runtime_env_hook` below (through
site/ddpdoctor_ray_hook.py, which the driver can import even without ddpdoctor; a hook the
user had set moves to $DDPDOCTOR_RAY_USER_HOOK and runs first, as before). It adds to the job's
`env_vars`: ddpdoctor's sitecustomize folder first on PYTHONPATH (the cluster's own PYTHONPATH
kept after it, through Ray's ${PYTHONPATH} expansion) and ddpdoctor's variables (the run
directory, the launch's marker). Every worker of the job then starts ddpdoctor's runtime at
startup (autostart.py) and becomes a rank when it joins a process group. Values the job's
runtime_env sets itself win. Nothing here may stop `ray.init()`: a failure leaves the
runtime_env as the user's hook returned it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ddpdoctor.runtime.autostart import SITE_DIR, with_site_dir

ENV_RAY_HOOK = "RAY_RUNTIME_ENV_HOOK"  # Ray's name (ray._private.ray_constants)
ENV_USER_HOOK = "DDPDOCTOR_RAY_USER_HOOK"  # the hook the user had set, chained first
# Set in the workers' env_vars: their PYTHONPATH ends in the cluster's, which may be empty (then
# the trailing separator would put the working directory on sys.path; the sitecustomize takes
# that entry out again).
ENV_RAY_PYTHONPATH = "DDPDOCTOR_RAY_PYTHONPATH"
# The hook as Ray loads it: a module of the sitecustomize folder, importable wherever that folder
# is on PYTHONPATH, which calls runtime_env_hook below.
HOOK_NAME = "ddpdoctor_ray_hook.runtime_env_hook"
PREFIX = "DDPDOCTOR_"
# ddpdoctor's own variables that stay on the driver
DRIVER_ONLY = frozenset({ENV_USER_HOOK})
# Ray's notation for "the cluster's value": ${PYTHONPATH} is expanded where the worker starts.
CLUSTER_PYTHONPATH = "${PYTHONPATH}"


def hook_env(base: Mapping[str, str]) -> dict[str, str]:
    """The variables `ddpdoctor run` adds to a command's environment so that Ray calls the hook:
    $RAY_RUNTIME_ENV_HOOK, and the user's own hook kept to chain to."""
    env = {ENV_RAY_HOOK: HOOK_NAME}
    user = base.get(ENV_RAY_HOOK, "")
    if user and user != HOOK_NAME:
        env[ENV_USER_HOOK] = user
    return env


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """Called by `ray.init()` on the driver: the job's runtime_env with ddpdoctor's added."""
    user = os.environ.get(ENV_USER_HOOK, "")
    if user and user != HOOK_NAME:
        runtime_env = _load(user)(runtime_env)  # the user's hook fails as it would have
    try:
        return with_ddpdoctor(runtime_env, os.environ)
    except Exception as exc:  # noqa: BLE001 - the job runs, unrecorded, rather than not at all
        _warn(f"Ray's workers are not recorded: {type(exc).__name__}: {exc}")
        return runtime_env


def with_ddpdoctor(
    runtime_env: Mapping[str, Any] | None,
    env: Mapping[str, str],
    site_dir: str = str(SITE_DIR),
) -> dict[str, Any]:
    """`runtime_env` (a dict, or None) with ddpdoctor's variables in its env_vars."""
    result = dict(runtime_env or {})
    given = result.get("env_vars") or {}
    env_vars = {str(k): str(v) for k, v in dict(given).items()}
    for name, value in env.items():
        if name.startswith(PREFIX) and name not in DRIVER_ONLY:
            env_vars.setdefault(name, value)
    if "PYTHONPATH" in env_vars:
        env_vars["PYTHONPATH"] = with_site_dir(env_vars["PYTHONPATH"], site_dir)
    else:
        env_vars["PYTHONPATH"] = with_site_dir(CLUSTER_PYTHONPATH, site_dir)
        env_vars[ENV_RAY_PYTHONPATH] = "1"
    result["env_vars"] = env_vars
    return result


def _load(name: str) -> Callable[[Any], Any]:
    """A "module.function" name, as Ray loads the hook (ray._private.utils.load_class)."""
    module, _, attr = name.rpartition(".")
    if not module:
        raise ValueError(f"{ENV_RAY_HOOK}={name!r} is not a module.function name")
    hook: Callable[[Any], Any] = getattr(importlib.import_module(module), attr)
    return hook


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"ddpdoctor: warning: {message}\n")
    except Exception:  # noqa: BLE001
        pass
