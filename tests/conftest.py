from __future__ import annotations

import functools
import gc
import signal

import pytest

from tests.procs import REPO, free_port  # noqa: F401 - re-exported for tests

FIXTURES = REPO / "tests" / "fixtures" / "logs"  # copied from the shared catalog

# A suite started in the background of a non-interactive shell (`make test &`, `nohup ... &`)
# inherits SIGINT ignored, and so would every process it starts: a test's Ctrl-C then reaches a
# doctor that ignores it, which no user's terminal does. A handled SIGINT is reset to the
# default in every process the tests start, as a terminal's would be.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@functools.cache
def gpu_available() -> bool:
    """NVML sees a GPU (cheap; does not import torch)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML finds none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _collector_pace_restored():
    """`ddpdoctor run` and `watch` set their process's collector pace (gc_pacing): tests that call
    them in this process get the suite's pace back."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.fixture
def run_dir(tmp_path):
    """A fresh, not yet created, run directory path for one test."""
    return tmp_path / "run"
