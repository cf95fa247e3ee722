"""A post-import hook: run a callback once a named module has been imported (the first import).

The runtime uses it to wrap `torch.distributed.init_process_group` in every process of a job
(autostart.py) and to wrap the training frameworks' dispatchers once they are imported
(frameworks.py). The module keeps its real loader, so tracebacks and `inspect` read its source.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs its callbacks once the named module has been executed (the first import of it)."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callbacks = [callback]
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def fire(self, module: Any) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in self.callbacks:
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001 - the import itself must succeed
                warn(f"event recording is off: {type(exc).__name__}: {exc}")


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: _AfterImport) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # the module keeps its real loader (linecache and inspect read sources through it)
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.hook.fire(module)


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.name == name:
            if callback not in finder.callbacks:  # the same callback registered again: once
                finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, _AfterImport(name, callback))


def warn(message: str) -> None:
    """One `ddpdoctor: warning:` line on the process's stderr (never raises: the job goes on)."""
    try:
        sys.stderr.write(f"ddpdoctor: warning: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
