"""Who a rank in a Ray worker is to Ray, and which of the user's calls run in it.

Kept apart from ray_worker.py (which wraps Ray's call paths and writes events through the
runtime): the hello event (info.py) reads these facts, and must not import the runtime's core.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

WORKER_SCRIPT = "default_worker.py"  # what the raylet runs: ray/_private/workers/

_lock = threading.Lock()
_running: dict[int, str] = {}  # call id -> name, of the user's calls now running
_next_id = 0


def enter(name: str) -> tuple[int, bool]:
    """A user's call starts: (its id, whether it is the only one running)."""
    global _next_id
    with _lock:
        _next_id += 1
        _running[_next_id] = name
        return _next_id, len(_running) == 1


def leave(call: int) -> tuple[str, bool]:
    """A user's call returned: (its name, whether none runs any more)."""
    with _lock:
        name = _running.pop(call, "")
        return name, not _running


def is_ray_worker(argv: Sequence[str]) -> bool:
    """The interpreter's command line (sys.orig_argv) is a Ray worker's."""
    script = next((word for word in argv[1:] if not word.startswith("-")), "")
    return os.path.basename(script) == WORKER_SCRIPT


TRAIN_CONTEXT_MODULE = "ray.train.v2._internal.execution.context"


def train_max_failures() -> int | None:
    """Ray Train's `FailureConfig(max_failures)` for the run this worker trains in (-1:
    unlimited), where Ray has set its training context; None when it cannot be read."""
    module = sys.modules.get(TRAIN_CONTEXT_MODULE)
    if module is None:
        return None
    try:
        config = module.get_train_context().train_run_context.run_config.failure_config
        value = getattr(config, "max_failures", None)
    except Exception:  # noqa: BLE001 - another Ray version: the budget stays unknown
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def busy() -> bool:
    with _lock:
        return bool(_running)


def facts() -> dict[str, Any] | None:
    """Who this rank is to Ray, for its hello event: {"actor_name", "actor_class", "actor_id",
    "job_id", "node_id", "node_ip", "worker_id", "busy", "calls"}; None outside a Ray worker."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        found: dict[str, Any] = {
            "actor_name": _text(_call(getattr(ctx, "get_actor_name", None))),
            "actor_class": _actor_class(ctx),
            "actor_id": _text(_call(getattr(ctx, "get_actor_id", None))),
            "job_id": _text(_call(getattr(ctx, "get_job_id", None))),
            "node_id": _text(_call(getattr(ctx, "get_node_id", None))),
            "worker_id": _text(_call(getattr(ctx, "get_worker_id", None))),
            "node_ip": _text(_call(getattr(ray.util, "get_node_ip_address", None))),
        }
    except Exception:  # noqa: BLE001 - the rank is recorded without Ray's names
        return None
    with _lock:
        found["busy"] = bool(_running)
        found["calls"] = sorted(set(_running.values()))
    return found


def _call(getter: Callable[[], Any] | None) -> Any:
    if getter is None:
        return None
    try:
        return getter()
    except Exception:  # noqa: BLE001
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:200]


def actor_class_from_title(title: str) -> str | None:
    """The actor's class from the process title Ray gives a worker between an actor's calls
    ("ray::RayTrainWorker") or during one named after its method ("ray::RayTrainWorker.execute");
    None for an idle or task worker. A call given a name of its own (`.options(name=...)`, which
    Ray Train's worker group does) titles the process with that name alone, hence
    actor_class_of_worker first."""
    if not title.startswith("ray::"):
        return None
    name = title[len("ray::") :].split(".", 1)[0].split(" ", 1)[0]
    return name[:200] if name and name != "IDLE" else None


def actor_class_of_worker(worker: Any) -> str | None:
    """The class of the one actor this worker process holds, from Ray's own table of it
    (worker.actors: actor id -> instance, filled when the actor was created here)."""
    actors = getattr(worker, "actors", None)
    if not isinstance(actors, dict) or len(actors) != 1:
        return None
    name = type(next(iter(actors.values()))).__name__
    return name[:200] or None


def _actor_class(ctx: Any) -> str | None:
    """The actor's class name (Ray Train's workers: "RayTrainWorker"): from Ray's table of the
    actors in this process, else from the process title (asking Ray for the actor's own handle
    could block the rank's hello)."""
    try:
        if getattr(ctx, "get_actor_id", lambda: None)() is None:
            return None
        worker_module = sys.modules.get("ray._private.worker")
        found = actor_class_of_worker(getattr(worker_module, "global_worker", None))
        if found:
            return found
        with open("/proc/self/cmdline", "rb") as fh:
            title = fh.read(4096).split(b"\0", 1)[0].decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        return None
    return actor_class_from_title(title)
