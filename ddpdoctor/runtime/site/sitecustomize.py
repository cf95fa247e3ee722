"""ddpdoctor's sitecustomize: put on PYTHONPATH by `ddpdoctor run -- COMMAND`, so that every Python
process of the job (the ranks an mp.spawn parent, a torchrun or srun starts) runs it at startup.

The mechanism is the one coverage.py uses to measure subprocesses. It does nothing outside a
ddpdoctor run ($DDPDOCTOR_RUN_DIR unset), and then hands over to the sitecustomize the environment
already had (the next one on sys.path), exactly as if this one were not there.
"""

import os
import sys


def _ddpdoctor_startup() -> None:
    if not os.environ.get("DDPDOCTOR_RUN_DIR"):
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


_ddpdoctor_startup()
_chain_to_next_sitecustomize()
