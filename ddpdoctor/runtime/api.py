"""The optional API a training script may call (also as `ddpdoctor.phase` / `ddpdoctor.log`).

Every function is a cheap no-op when ddpdoctor is not recording (no run directory), and none of
them ever raises: instrumentation must not be the thing that breaks a training run.

    ddpdoctor.phase("eval")                  # name what the rank does now
    with ddpdoctor.phase("checkpoint"):      # ... or for a block; the previous phase comes back
        save(model)
    ddpdoctor.log(step=step, loss=loss)      # metrics; the loss is attached to the current step
    api.warn("data.short_shard", "rank 3 has 10% fewer samples", samples=900)
    api.fault("hang:rank=1,step=5", "hang", 5)   # an injected fault, just before it fires
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Any, Literal

from ddpdoctor.protocol.events import FAULT, WARNING
from ddpdoctor.runtime import core, records

# Envelope names a metric must not overwrite; such metrics are written as "user_<name>".
_RESERVED = frozenset({"v", "t", "mono", "rank", "kind"})
_MAX_LIST = 64
_MAX_TEXT = 500


class PhaseScope:
    """Returned by phase(): ignore it, or use it in a `with` to restore the previous phase."""

    __slots__ = ("_previous", "_runtime")

    def __init__(self, runtime: core.Runtime | None, previous: str | None) -> None:
        self._runtime = runtime
        self._previous = previous

    def __enter__(self) -> PhaseScope:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        runtime = self._runtime
        if runtime is not None and self._previous is not None and core.active() is runtime:
            try:
                runtime.set_phase(self._previous)
            except Exception:  # noqa: BLE001
                pass
        return False


_NO_SCOPE = PhaseScope(None, None)


def phase(name: str) -> PhaseScope:
    """Enter phase `name` ("init", "data", "train", "eval", "checkpoint", ... or your own).

    Until a script calls this, ddpdoctor names the phase itself from the DDP forwards and the
    optimizer steps ("train", "eval"), or takes Lightning's; from the first call on, the
    script's phases are the only ones (Lightning's hooks still name theirs)."""
    runtime = core.active()
    if runtime is None:
        return _NO_SCOPE
    try:
        return PhaseScope(runtime, runtime.set_phase(str(name)))
    except Exception:  # noqa: BLE001
        return _NO_SCOPE


def log(**metrics: Any) -> None:
    """Write a `metrics` event. `loss` is attached to the step in progress, `epoch` sets the
    epoch; tensors and numpy scalars become plain numbers (a GPU tensor syncs, as .item() does)."""
    runtime = core.active()
    if runtime is None or not metrics:
        return
    try:
        values = {(f"user_{k}" if k in _RESERVED else k): plain(v) for k, v in metrics.items()}
        loss = values.get("loss")
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            runtime.steps.on_loss(float(loss))
        epoch = values.get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            runtime.steps.set_epoch(epoch)
        if values.get("step") is None:
            values["step"] = runtime.steps.current
        # a hot-path record: the JSON is made by the writer thread
        runtime.record((records.metrics, runtime.wall_clock(), runtime.mono_clock(), values))
    except Exception:  # noqa: BLE001
        pass


def warn(code: str, message: str, **details: Any) -> None:
    """Write a `warning` event (code: a dotted id such as "data.uneven_shards")."""
    runtime = core.active()
    if runtime is None:
        return
    try:
        runtime.emit(
            WARNING,
            code=str(code),
            message=str(message),
            details={str(k): plain(v) for k, v in details.items()},
        )
    except Exception:  # noqa: BLE001
        pass


def fault(spec_text: str, kind: str, step: int | None) -> None:
    """Record an injected fault just before triggering it (the reference job's --inject)."""
    runtime = core.active()
    if runtime is None:
        return
    try:
        runtime.emit(
            FAULT, inject=str(spec_text), fault=str(kind), step=None if step is None else int(step)
        )
    except Exception:  # noqa: BLE001
        pass


def plain(value: Any) -> Any:
    """A JSON-friendly copy of a metric value (small and cheap; never the data of a big tensor)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    numel = getattr(value, "numel", None)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            if not callable(numel) or numel() == 1:
                return plain(item())
        except Exception:  # noqa: BLE001
            pass
    if isinstance(value, list | tuple) and len(value) <= _MAX_LIST:
        return [plain(v) for v in value]
    if isinstance(value, dict) and len(value) <= _MAX_LIST:
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)[:_MAX_TEXT]
