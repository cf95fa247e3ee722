"""Fixtures of the runtime's unit tests: a real one-rank gloo world, a runtime recording."""

from __future__ import annotations

import pytest

from ddpdoctor.runtime import deactivate
from tests.runtime_helpers import start_recording


@pytest.fixture(scope="module")
def world():
    """A one-rank gloo process group (torch.distributed imported only by the tests that ask)."""
    dist = pytest.importorskip("torch.distributed")
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        created = True
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture
def recording(tmp_path, monkeypatch, world):
    yield start_recording(tmp_path, monkeypatch)
    deactivate()
