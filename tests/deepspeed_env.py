"""DeepSpeed on CPU for the tests: the jobs' environment and its CPU op, built once.

DeepSpeed on CPU (`DS_ACCELERATOR=cpu`) loads a shared-memory op it compiles into
~/.cache/torch_extensions with the first `ninja` on PATH. The system's ninja (1.11) and the
venv's (1.13) discard each other's build log, so an op built by one is rebuilt by the other:
minutes in every job on a loaded machine. Every DeepSpeed job of the suite therefore runs with
the venv's `bin` first on PATH, and the op is built once, with that environment, before the
first job (minutes the first time on a machine, then a no-op). The venv's own path, not a
symlink to it: the `deepspeed` launcher starts its ranks with its interpreter's path, and the op
is rebuilt whenever DeepSpeed is imported from another path. And into a build folder of the
venv's own (`TORCH_EXTENSIONS_DIR`): in torch's default one, a second checkout's jobs (a clean
clone's suite, a benchmark) rebuild the op for their own sources under the same lock, and ranks
wait on it until their tests' time runs out.

Its CPU all-reduce keeps two 66 MiB buffers per job in /dev/shm that DeepSpeed never unlinks:
a slow tier left a few GiB of memory there, and run after run 12 GiB, half of this machine's.
The fixtures that run DeepSpeed jobs remove the buffers their jobs left (`shm_buffers_removed`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import clean_env

VENV_BIN = Path(sys.prefix).resolve() / "bin"
PYTHON = str(VENV_BIN / "python")
BUILD_TIMEOUT_S = 1800
EXTENSIONS_DIR = (
    Path.home()
    / ".cache"
    / "torch_extensions"
    / f"ddpdoctor-tests-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}"
)


def deepspeed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = clean_env({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **(extra or {})})
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    return env


def build_shared_memory_op() -> None:
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    try:
        done = subprocess.run(
            [PYTHON, "-c", code], env=deepspeed_env(), capture_output=True, text=True,
            timeout=BUILD_TIMEOUT_S, start_new_session=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"DeepSpeed's CPU op did not build within {BUILD_TIMEOUT_S} s")
    assert done.returncode == 0, done.stderr[-3000:]


SHM_BUFFERS = "/dev/shm/deepspeed_allreduce_buffer_*"


def _mapped_shm() -> set[str]:
    """The /dev/shm files some process maps now."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        with contextlib.suppress(OSError), open(maps) as fh:
            mapped.update(line.split()[-1] for line in fh if "/dev/shm/" in line)
    return mapped


@contextlib.contextmanager
def shm_buffers_removed() -> Iterator[None]:
    """Remove the DeepSpeed buffers that appeared in /dev/shm while the block ran and that no
    process maps any more (another module's job still running keeps its own)."""
    before = set(glob.glob(SHM_BUFFERS))
    try:
        yield
    finally:
        left = set(glob.glob(SHM_BUFFERS)) - before
        if left:
            for path in left - _mapped_shm():
                with contextlib.suppress(OSError):
                    os.unlink(path)
