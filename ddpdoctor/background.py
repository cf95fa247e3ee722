"""One bounded piece of work off the polling thread (a py-spy capture, a pass of the explainers).

A daemon thread, so a stuck helper can never keep ddpdoctor alive; the poller only looks at
`done` and takes the result or the exception when it is there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class BackgroundTask:
    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self._fn = fn
        self._done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"ddpdoctor-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the poller, never raised here
            self.error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)
