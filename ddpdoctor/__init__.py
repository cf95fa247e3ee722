"""ddpdoctor: diagnostics and troubleshooting for PyTorch DistributedDataParallel.

Public API (importing ddpdoctor stays cheap: torch and textual load only when used):

    from ddpdoctor import run_checks          # the preflight doctor -> DoctorReport
    report = run_checks(["network", "system"])
    report.exit_code, report.to_json()

    import ddpdoctor                          # inside a training script (optional)
    ddpdoctor.phase("eval")                   # name what the rank is doing now
    ddpdoctor.log(step=10, loss=0.31)         # metrics shown by the monitor

    from ddpdoctor import explain_files       # log explainers -> list[Finding]
    from ddpdoctor import diagnose_run_dir    # post-mortem of a run directory -> Snapshot
    from ddpdoctor import check_scripts       # static DDP checkup of training scripts
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpdoctor._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
    from ddpdoctor.checks.model import CheckOutcome, CheckResult, Status
    from ddpdoctor.checks.registry import Check, all_checks, get_check
    from ddpdoctor.checks.report import DoctorReport
    from ddpdoctor.checks.runner import run_checks
    from ddpdoctor.checks.scriptcheck import check_scripts
    from ddpdoctor.exit_codes import ExitCode
    from ddpdoctor.explain import explain_files
    from ddpdoctor.findings import Evidence, Finding, Severity
    from ddpdoctor.monitor import diagnose_run_dir
    from ddpdoctor.runtime.api import log, phase

_LAZY = {
    "run_checks": "ddpdoctor.checks.runner",
    "check_scripts": "ddpdoctor.checks.scriptcheck",
    "CheckContext": "ddpdoctor.checks.context",
    "DoctorOptions": "ddpdoctor.checks.context",
    "Probes": "ddpdoctor.checks.context",
    "CheckResult": "ddpdoctor.checks.model",
    "CheckOutcome": "ddpdoctor.checks.model",
    "Status": "ddpdoctor.checks.model",
    "Check": "ddpdoctor.checks.registry",
    "all_checks": "ddpdoctor.checks.registry",
    "get_check": "ddpdoctor.checks.registry",
    "DoctorReport": "ddpdoctor.checks.report",
    "ExitCode": "ddpdoctor.exit_codes",
    "Evidence": "ddpdoctor.findings",
    "Finding": "ddpdoctor.findings",
    "Severity": "ddpdoctor.findings",
    "explain_files": "ddpdoctor.explain",
    "diagnose_run_dir": "ddpdoctor.monitor",
    "phase": "ddpdoctor.runtime.api",
    "log": "ddpdoctor.runtime.api",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
