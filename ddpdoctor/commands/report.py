"""`ddpdoctor report RUN_DIR [--trace FILE] [-o FILE]`: a picture of a run.

Writes RUN_DIR/report.html (or -o FILE): self-contained, it opens offline and can be attached to
an issue. --trace FILE also writes the timeline as Chrome/Perfetto trace-event JSON. Exit codes:
0 written, 2 not a run directory or a file that cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol import jsontext
from ddpdoctor.report import build_report


def main(args: argparse.Namespace) -> int:
    report = build_report(args.run_dir)  # not a run directory: UsageError, exit 2
    out = Path(args.output) if args.output else report.run.path / "report.html"
    _write(out, report.html())
    sys.stdout.write(f"report: {out}\n")
    if args.trace:
        _write(Path(args.trace), jsontext.dumps(report.trace()) + "\n")
        sys.stdout.write(f"trace: {args.trace} (open it in ui.perfetto.dev or chrome://tracing)\n")
    return int(ExitCode.OK)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
