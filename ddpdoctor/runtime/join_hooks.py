"""torch's Join context manager: whether a rank's loop runs inside `with Join(...)`.

Join (torch.distributed.algorithms.join) is torch's answer to ranks with different numbers of
batches: a rank out of data shadows the others' collectives from `Join.__exit__` until every rank
is out, so uneven loaders end evenly instead of hanging. A loader whose epoch starts inside an
open Join is therefore evened by design, and its `epoch` event says so (`join`: data_hooks.py),
so that the judge does not warn that the ranks with more batches will wait forever. For the
same reason the replicas' digests at due steps stop once a Join is entered (replicas.py): under
Join the ranks' step numbers part, and their replicas differ between Join's syncs, by design.

A Join made with `enable=False` evens nothing and is not counted. Only the depth of open Join contexts of this process is kept: `__enter__` and `__exit__` are
wrapped to count, nothing else of Join changes, and a failure to count never reaches the job.
"""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.runtime import core, replicas
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

_open = 0  # Join contexts entered and not yet exited, in this process


def is_open() -> bool:
    """Whether a `with Join(...)` is open in this process now."""
    return _open > 0


def install(runtime: core.Runtime) -> None:
    from torch.distributed.algorithms.join import Join

    original_enter = Join.__enter__
    original_exit = Join.__exit__
    if hasattr(original_enter, WRAPPED_MARK):
        return

    @functools.wraps(original_enter)
    def __enter__(self: Any) -> Any:
        global _open
        result = original_enter(self)
        if _evens(self):  # once entered: an __enter__ that raised opened nothing
            _open += 1
            try:
                replicas.stop_step_digests()
            except Exception:  # noqa: BLE001 - only the replicas' record may suffer, never Join
                pass
        return result

    @functools.wraps(original_exit)
    def __exit__(self: Any, *exc_info: Any) -> Any:
        global _open
        try:
            return original_exit(self, *exc_info)
        finally:
            if _evens(self):
                _open = max(0, _open - 1)

    patch(runtime, Join, "__enter__", __enter__, original_enter)
    patch(runtime, Join, "__exit__", __exit__, original_exit)
    runtime.on_deactivate(_reset)


def _evens(join: Any) -> bool:
    """Whether this Join shadows collectives: `Join(..., enable=False)` is a no-op by design."""
    return getattr(join, "_enable", True) is not False


def _reset() -> None:
    global _open
    _open = 0
