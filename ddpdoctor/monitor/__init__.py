"""Watch a run, in stages that data passes through one way (each a package; lowest first):

    model/     per-rank records folded from events and rows (RunState) -> the frozen Snapshot
    follow/    the run directory tailed, node summaries and records, host-only facts (py-spy, NVML)
    judge/     the verdict rules (judge/rules/) on a Snapshot, the diagnosis, the run's ending
    tell/      a diagnosed Snapshot as text, the headless live view, diagnosis.json
    pipeline/  the stages wired: Monitor's poll, post-mortems

A stage imports only the stages listed above it (tests/unit/test_layers.py). Never imports
textual: everything here works without a terminal. May import: explain, stacks, the protocol and
the shared vocabulary.

    Monitor(run_dir, hang_after=None, capture_stacks=True)   .poll() / .request_stacks() / .close()
    diagnose_run_dir(path) -> Snapshot                        the post-mortem of a run directory
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ddpdoctor.monitor.pipeline.live import Monitor
    from ddpdoctor.monitor.pipeline.postmortem import diagnose_run_dir

__all__ = ["Monitor", "diagnose_run_dir"]

# Lazy, so that importing a submodule (the log explainers, the snapshot types) does not load the
# whole monitor and psutil with it.
_LAZY = {
    "Monitor": "ddpdoctor.monitor.pipeline.live",
    "diagnose_run_dir": "ddpdoctor.monitor.pipeline.postmortem",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ddpdoctor.monitor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
