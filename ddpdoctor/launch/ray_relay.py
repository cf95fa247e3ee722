"""Start the Ray relay next to a Ray job on a running cluster, and end it before the last look.

The relay (ddpdoctor/monitor/follow/ray_relay.py) is a process of its own: a Ray driver that
places one node actor on each other node of the cluster and writes their summaries into the run
directory, so that ranks on hosts that share no file system with this one reach the monitor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from ddpdoctor.protocol.rundir import RunDir

RELAY_MODULE = "ddpdoctor.monitor.follow.ray_relay"
ENV_RELAY = "DDPDOCTOR_RAY_RELAY"  # "0": `ddpdoctor run` starts no relay


class RelayProcess:
    """The launcher's handle: start the relay next to a Ray job, end it before the last look."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc

    @classmethod
    def start(cls, run: RunDir, env: dict[str, str]) -> RelayProcess | None:
        """A relay when the job names a running Ray cluster (RAY_ADDRESS), else None."""
        address = env.get("RAY_ADDRESS", "")
        if not address or address.startswith("ray://") or os.environ.get(ENV_RELAY) == "0":
            return None
        # Its own environment: not the job's (no runtime hook, no launch marker).
        clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_RUNTIME_ENV")}
        log = run.path / "logs" / "ray-relay.log"
        with contextlib.suppress(OSError):
            log.parent.mkdir(parents=True, exist_ok=True)
        out: Any = subprocess.DEVNULL
        with contextlib.suppress(OSError):
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", RELAY_MODULE, str(run.path), address],
                env=clean,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        except OSError:
            return None
        finally:
            if isinstance(out, int) and out >= 0:
                os.close(out)
        return cls(proc)

    def finish(self, timeout_s: float = 20.0) -> None:
        """Bring the other nodes' files home and mark their records ended (bounded)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except Exception:  # noqa: BLE001
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(5)
