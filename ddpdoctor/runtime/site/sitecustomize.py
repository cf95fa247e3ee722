"""ddpdoctor's sitecustomize: put on PYTHONPATH by `ddpdoctor run -- COMMAND`, so that every Python
process of the job (the ranks an mp.spawn parent, a torchrun or srun starts) runs it at startup.

The mechanism is the one coverage.py uses to measure subprocesses. It does nothing outside a
ddpdoctor run ($DDPDOCTOR_RUN_DIR unset), and then hands over to the sitecustomize the environment
already had (the next one on sys.path), exactly as if this one were not there.
"""

import os
import sys


def _tidy_path_from_ray() -> None:
    """In a Ray worker reached through the job's runtime_env (ddpdoctor.runtime.ray_env): its
    PYTHONPATH is this folder, then the cluster's own, which may be empty. An empty tail leaves a
    trailing separator, which Python reads as the working directory: take that entry out again,
    so the worker's sys.path is the cluster's with this folder in front. ddpdoctor itself comes
    from the cluster's Python where it is installed there, else from beside this folder."""
    if os.environ.get("DDPDOCTOR_RAY_PYTHONPATH") != "1":
        return
    pythonpath = os.environ.get("PYTHONPATH", "")
    here = os.path.dirname(os.path.abspath(__file__))
    if pythonpath.endswith(os.pathsep):
        os.environ["PYTHONPATH"] = pythonpath.rstrip(os.pathsep)
        cwd = os.getcwd()
        after_here = [i for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
        start = after_here[0] + 1 if after_here else 1
        for index in range(start, len(sys.path)):
            if sys.path[index] == cwd:
                del sys.path[index]
                break
    try:
        import importlib.util

        if importlib.util.find_spec("ddpdoctor") is None:
            sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    except (ImportError, ValueError):
        pass


# Ray's own helper processes (its dashboard and its agents, the log monitor, the autoscaler):
# never a rank. The raylet gives its agents about 15 s to start and aborts when one is late
# ("Timed out waiting for file .../metrics_agent_port_..."): on a loaded machine, the second
# ddpdoctor's import costs there is enough to miss it. A Ray worker (workers/default_worker.py)
# runs the user's code and is followed as before.
_RAY_HELPER_DIRS = ("/ray/dashboard/", "/ray/autoscaler/", "/ray/_private/")
_RAY_WORKER_DIR = "/ray/_private/workers/"


def _is_ray_helper() -> bool:
    """The interpreter runs a script of Ray's own helpers (read from sys.orig_argv: sys.argv is
    not set yet while site runs)."""
    argv = getattr(sys, "orig_argv", None) or []
    script = next((str(w) for w in argv[1:] if not str(w).startswith("-")), "")
    script = script.replace(os.sep, "/")
    if _RAY_WORKER_DIR in script:
        return False
    return script.endswith(".py") and any(part in script for part in _RAY_HELPER_DIRS)


def _ddpdoctor_startup() -> None:
    if not os.environ.get("DDPDOCTOR_RUN_DIR") or _is_ray_helper():
        return
    try:
        from ddpdoctor.runtime import autostart

        autostart.on_startup()
    except Exception as exc:  # noqa: BLE001 - a job must start even when ddpdoctor cannot
        try:
            sys.stderr.write(
                f"ddpdoctor: warning: event recording is off: {type(exc).__name__}: {exc}\n"
            )
        except Exception:  # noqa: BLE001
            pass
        _say_why(exc)


def _say_why(exc: BaseException) -> None:
    """Leave the reason in RUN_DIR/processes.jsonl (the format of ddpdoctor.protocol.processes,
    written with the standard library alone: ddpdoctor itself may be what failed to import)."""
    try:
        import json
        import socket
        import time

        record = {
            "v": 1,
            "t": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "argv": [str(w)[:200] for w in getattr(sys, "argv", [])[:8]],
            "load_error": f"{type(exc).__name__}: {exc}"[:500],
            "python": sys.executable,
        }
        data = (json.dumps(record) + "\n").encode("utf-8", "replace")
        path = os.path.join(os.environ["DDPDOCTOR_RUN_DIR"], "processes.jsonl")
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o600)
        try:
            os.write(fd, data[:4000])
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - the job goes on regardless
        pass


def _chain_to_next_sitecustomize() -> None:
    """Import the sitecustomize that this one hides (a venv's, a distribution's, coverage's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401 - the next one runs on import
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


_tidy_path_from_ray()
_ddpdoctor_startup()
_chain_to_next_sitecustomize()
