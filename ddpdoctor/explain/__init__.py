"""Log explainers: NCCL, the torch watchdog, torchrun, gloo, c10d, DDP and Python tracebacks.

explain_files(paths) -> list[Finding]        files or run directories, combined, worst first
explain_lines(lines, file=None) -> list[Finding]
classify_line(text) -> LineClass | None      cheap per-line level + finding id (live log panel)

log_rules.py holds the shared helpers of the per-log modules (nccl, watchdog, torchrun, gloo, c10d,
ddp, python); the verdict rules of a live run are ddpdoctor.monitor.judge.rules.

May import: the protocol (run-directory layout) and the shared vocabulary.
"""

from __future__ import annotations

from ddpdoctor.explain.classify import LineClass, classify_line
from ddpdoctor.explain.engine import explain_files, explain_lines

__all__ = ["LineClass", "classify_line", "explain_files", "explain_lines"]
