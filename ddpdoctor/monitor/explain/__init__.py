"""Log explainers: NCCL, the torch watchdog, torchrun, gloo, c10d, DDP and Python tracebacks.

explain_files(paths) -> list[Finding]        files or run directories, combined, worst first
explain_lines(lines, file=None) -> list[Finding]
classify_line(text) -> LineClass | None      cheap per-line level + finding id (live log panel)
"""

from __future__ import annotations

from ddpdoctor.monitor.explain.classify import LineClass, classify_line
from ddpdoctor.monitor.explain.engine import explain_files, explain_lines

__all__ = ["LineClass", "classify_line", "explain_files", "explain_lines"]
