"""The model of a run: tail the run directory -> events -> RunState -> frozen Snapshot; the verdict
rules (verdict_rules/) and the diagnosis. Never imports textual: everything here works without a
terminal. May import: explain, stacks, the protocol and the shared vocabulary.

    Monitor(run_dir, hang_after=None, capture_stacks=True)   .poll() / .request_stacks() / .close()
    diagnose_run_dir(path) -> Snapshot                        the post-mortem of a run directory
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ddpdoctor.monitor.live import Monitor
    from ddpdoctor.monitor.postmortem import diagnose_run_dir

__all__ = ["Monitor", "diagnose_run_dir"]

# Lazy, so that importing a submodule (the log explainers, the snapshot types) does not load the
# whole monitor and psutil with it.
_LAZY = {"Monitor": "ddpdoctor.monitor.live", "diagnose_run_dir": "ddpdoctor.monitor.postmortem"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ddpdoctor.monitor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
