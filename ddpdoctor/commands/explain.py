"""`ddpdoctor explain [--json] FILE...`: say what went wrong in NCCL / torch / torchrun / gloo logs
and PyTorch flight-recorder dumps (ddpdoctor.explain.flight_recorder), told as one story; of a run
directory, also whether the DDP replicas agreed at the end, and of per-rank checkpoints
(`rank-0.pt rank-1.pt`), whether they hold the same replica."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ddpdoctor.console import make_console, stream_is_unicode, symbols_for
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.explain.engine import explain_paths
from ddpdoctor.explain.render import render_findings
from ddpdoctor.findings import Severity
from ddpdoctor.monitor.pipeline import replica_checkpoints, replica_end
from ddpdoctor.monitor.pipeline.postmortem import without_ddpdoctors_own_stop
from ddpdoctor.protocol import jsontext

SCHEMA_VERSION = 1


def main(args: argparse.Namespace) -> int:
    logs, checkpoints = _split(args.files)
    result = explain_paths(logs)  # a missing or unreadable file raises UsageError: exit 2
    findings = without_ddpdoctors_own_stop(result.findings, args.files)
    # the replicas: whether they agreed at the end of a run, or in per-rank checkpoints
    for given in logs:
        if Path(given).is_dir() and replica_end.has_events(Path(given)):
            findings = [*findings, *replica_end.findings(Path(given))]
    if checkpoints:
        findings = [*findings, *replica_checkpoints.findings(checkpoints)]
        result = replace(result, files=result.files + len(checkpoints))
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


def _split(files: list[str]) -> tuple[list[str], list[Path]]:
    """(logs, dumps and run directories; torch.save'd checkpoints, compared as replicas)."""
    logs: list[str] = []
    checkpoints: list[Path] = []
    for given in files:
        path = Path(given)
        if replica_checkpoints.is_checkpoint(path):
            checkpoints.append(path)
        else:
            logs.append(given)
    return logs, checkpoints
