"""A Python driver for a torchft job: the lighthouse and two replica groups, each its own
torchrun (--max-restarts 1), started with subprocess; the driver ends the lighthouse once the
groups are done and exits with the first failure. Usage: python launch.py SCRIPT MODE
$LIGHTHOUSE_PORT picks the lighthouse's port (default: a free one)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def main() -> int:
    script, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "healthy"
    port = os.environ.get("LIGHTHOUSE_PORT") or str(free_port())
    lighthouse = subprocess.Popen(
        ["torchft_lighthouse", "--min_replicas", "1", "--join_timeout_ms", "10000",
         "--bind", f"[::]:{port}"]
    )  # fmt: skip
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=f"http://localhost:{port}")
    groups = [
        subprocess.Popen(
            [
                "torchrun",
                "--standalone",
                "--nnodes=1",
                "--nproc-per-node=1",
                "--max-restarts=1",
                str(HERE / script),
                mode,
                "--group",
                str(group),
            ],
            env=dict(env, REPLICA_GROUP_ID=str(group)),
        )
        for group in (0, 1)
    ]
    try:
        codes = [g.wait() for g in groups]
    finally:
        lighthouse.terminate()
        lighthouse.wait(timeout=30)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
