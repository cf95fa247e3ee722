"""`ddpdoctor report RUN_DIR [--trace FILE] [-o FILE]`: a picture of a run.

Writes RUN_DIR/report.html (or -o FILE): self-contained, it opens offline and can be attached to
an issue. --trace FILE also writes the timeline as Chrome/Perfetto trace-event JSON. Exit codes:
0 written, 2 not a run directory or a file that cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddpdoctor.console import one_line
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import write_text_atomic
from ddpdoctor.report import build_report


def main(args: argparse.Namespace) -> int:
    report = build_report(args.run_dir)  # not a run directory: UsageError, exit 2
    out = Path(args.output) if args.output else report.run.path / "report.html"
    _write(out, report.html())
    sys.stdout.write(f"report: {one_line(str(out))}\n")
    if args.trace:
        _write(Path(args.trace), jsontext.dumps(report.trace()) + "\n")
        sys.stdout.write(
            f"trace: {one_line(args.trace)} (open it in ui.perfetto.dev or chrome://tracing)\n"
        )
    return int(ExitCode.OK)


def _write(path: Path, text: str) -> None:
    """Atomically, 0600, never through a link (a symlink named report.html is replaced, its
    target left alone): the page quotes the job's output, which is the job's owner's to share."""
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
