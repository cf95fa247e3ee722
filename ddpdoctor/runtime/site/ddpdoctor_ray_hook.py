"""Ray's runtime-env hook as `ddpdoctor run` names it ($RAY_RUNTIME_ENV_HOOK): importable from
this folder (first on the job's PYTHONPATH) even by an interpreter that cannot import ddpdoctor,
so that `ray.init()` never fails because of it. The work is ddpdoctor.runtime.ray_env's; without
ddpdoctor, only the hook the user had set runs, as it would have."""

import importlib
import os
from typing import Any


def runtime_env_hook(runtime_env: Any) -> Any:
    try:
        from ddpdoctor.runtime.ray_env import runtime_env_hook as hook
    except Exception:  # noqa: BLE001 - ddpdoctor is not importable in this interpreter
        user = os.environ.get("DDPDOCTOR_RAY_USER_HOOK", "")
        module, _, attr = user.rpartition(".")
        if module:
            return getattr(importlib.import_module(module), attr)(runtime_env)
        return runtime_env
    return hook(runtime_env)
