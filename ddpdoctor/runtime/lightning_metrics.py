"""The user's line behind a metric Lightning syncs later: `self.log(name, value, sync_dist=True)`.

A metric logged in `validation_step` (or with `on_epoch=True` anywhere) is reduced across the
ranks when Lightning computes its epoch value, at the end of the epoch, from its own loop: the
collectives (`_sync_ddp`'s barrier and all-reduce) have no frame of the user's on the stack but
`trainer.fit(...)`. Under `if self.global_rank == 0:` only rank 0 logged it, so only rank 0 makes
them, and the diagnosis must name the `self.log` line, which is long gone from the stack.

So `_ResultCollection.log` (what `LightningModule.log`, `log_dict` and a callback's
`pl_module.log` all go through) is wrapped: the first time a metric is logged with `sync_dist`,
its site (the user's line, via `LightningModule.log`) is remembered under the metric's (hook, name);
and `_ResultMetric.compute` is registered with call_sites, so that a collective made while it
computes that metric takes the remembered site, marked `"deferred": true`.

Cost: one keyword lookup per `self.log` call, one dict lookup when the metric's site is already
known; the site walk once per metric.
"""

from __future__ import annotations

import functools
import importlib
import sys
from types import FrameType
from typing import Any

from ddpdoctor.runtime import call_sites, core
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

_RESULT_MODULE = "trainer.connectors.logger_connector.result"
MAX_METRICS = 1024
# (hook, metric name) -> the JSON text of its site, marked deferred
_SITES: dict[tuple[str, str], str] = {}


def remember(fx: Any, name: Any, caller: FrameType | None) -> None:
    """The metric `name` logged from hook `fx`, with sync_dist, by the code of frame `caller`."""
    key = (str(fx), str(name))
    if key in _SITES:
        return
    text = call_sites.site_of(caller)
    if text is None or not text.endswith("}"):
        return
    if len(_SITES) >= MAX_METRICS:
        _SITES.clear()
    # `"site":{...}`: the same object with one more field
    _SITES[key] = text[:-1] + ',"deferred":true}'


def site_of_metric(frame: FrameType) -> str | None:
    """In `_ResultMetric.compute`: the site its metric was logged from, if it was remembered."""
    meta = getattr(frame.f_locals.get("self"), "meta", None)
    if meta is None:
        return None
    fx, name = str(getattr(meta, "fx", "")), str(getattr(meta, "name", ""))
    found = _SITES.get((fx, name))
    if found is None and "/dataloader_idx_" in name:  # the name Lightning gave it, suffixed
        found = _SITES.get((fx, name.partition("/dataloader_idx_")[0]))
    return found


def wrap(package: Any, runtime: core.Runtime) -> None:
    """Wrap `<package>.trainer...result._ResultCollection.log` and register
    `_ResultMetric.compute` (once per process; a Lightning without them is left alone)."""
    try:
        result = importlib.import_module(f"{package.__name__}.{_RESULT_MODULE}")
    except Exception:  # noqa: BLE001 - another Lightning layout: no deferred sites
        return
    collection = getattr(result, "_ResultCollection", None)
    original = getattr(collection, "log", None)
    compute = getattr(getattr(result, "_ResultMetric", None), "compute", None)
    code = getattr(compute, "__code__", None)
    if original is None or code is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def log(self: Any, fx: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("sync_dist") and (fx, name) not in _SITES:
            try:
                remember(fx, name, sys._getframe(1))
            except Exception:  # noqa: BLE001 - recording must never break training
                pass
        return original(self, fx, name, *args, **kwargs)

    patch(runtime, collection, "log", log, original)
    call_sites.register_origin(code, site_of_metric)
    runtime.on_deactivate(functools.partial(call_sites.unregister_origin, code))


def forget() -> None:
    """Drop the remembered sites (tests)."""
    _SITES.clear()
