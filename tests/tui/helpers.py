"""Helpers for driving the app headless in tests."""

from __future__ import annotations

import time
from collections.abc import Callable


async def wait_until(
    pilot, predicate: Callable[[], object], *, timeout: float = 10.0, what: str = ""
):
    """Let the app run until predicate() is truthy (bounded: a stuck app fails the test, never hangs it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        await pilot.pause(0.02)


async def first_snapshot(pilot, count: int = 1) -> None:
    await wait_until(pilot, lambda: pilot.app.applied >= count, what=f"{count} applied snapshot(s)")
    await pilot.pause()
