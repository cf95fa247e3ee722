"""`ddpdoctor explain [--json] FILE...`: say what went wrong in NCCL / torch / torchrun / gloo logs
and PyTorch flight-recorder dumps (ddpdoctor.explain.flight_recorder), told as one story."""

from __future__ import annotations

import argparse
import sys

from ddpdoctor.console import make_console, stream_is_unicode, symbols_for
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.explain.engine import explain_paths
from ddpdoctor.explain.render import render_findings
from ddpdoctor.findings import Severity
from ddpdoctor.monitor.pipeline.postmortem import without_ddpdoctors_own_stop
from ddpdoctor.protocol import jsontext

SCHEMA_VERSION = 1


def main(args: argparse.Namespace) -> int:
    result = explain_paths(args.files)  # a missing or unreadable file raises UsageError: exit 2
    findings = without_ddpdoctors_own_stop(result.findings, args.files)
    if args.json:
        document = {"schema_version": SCHEMA_VERSION, "findings": [f.to_json() for f in findings]}
        sys.stdout.write(jsontext.dumps(document, indent=2) + "\n")
    else:
        render_findings(
            findings,
            make_console(),
            files=result.files,
            lines=result.lines,
            symbols=symbols_for(sys.stdout),
            unicode=stream_is_unicode(sys.stdout),
        )
    failed = any(f.severity is Severity.ERROR for f in findings)
    return int(ExitCode.PROBLEMS if failed else ExitCode.OK)
