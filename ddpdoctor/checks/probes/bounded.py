"""Run one blocking call with a deadline, in a daemon thread that is abandoned when it overruns.

A DNS server that never answers, or an fcntl lock on NFS without lockd, blocks inside the C
library where no Python timeout reaches. Running the call in a daemon thread bounds the wait: the
caller gets `timed_out=True` at the deadline, and the stuck thread cannot keep the process alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Bounded(Generic[T]):
    value: T | None = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.error is None


def bounded_call(func: Callable[[], T], timeout_s: float, *, name: str = "bounded") -> Bounded[T]:
    """Call `func()`; its value, the exception it raised, or timed_out after `timeout_s` seconds."""
    box: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller as data
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=f"ddpdoctor:{name}", daemon=True).start()
    if not done.wait(timeout_s):
        return Bounded(timed_out=True)
    error = box.get("error")
    if error is not None:
        return Bounded(error=error)  # type: ignore[arg-type]
    return Bounded(value=box.get("value"))  # type: ignore[arg-type]
