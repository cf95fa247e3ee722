"""`ddpdoctor doctor`: run the preflight checks and report them as text, JSON or JUnit XML."""

from __future__ import annotations

import argparse
import sys

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.progress import progress_spinner
from ddpdoctor.checks.registry import GROUP_TITLES, all_checks
from ddpdoctor.checks.render import render_report
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_checks
from ddpdoctor.console import make_console, symbols_for
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol import jsontext


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    _check_init_method(args.init_method)
    return DoctorOptions(
        nproc=args.nproc,
        nnodes=args.nnodes,
        backend=args.backend,
        init_method=args.init_method,
        master_addr=args.master_addr,
        master_port=args.master_port,
        smoke=not args.no_smoke,
        workers=args.workers,
        scripts=tuple(_existing_scripts(getattr(args, "script", None) or ())),
    )


def _check_init_method(method: str | None) -> None:
    """An --init-method that is not even a URL is a usage error, not a check that crashes."""
    if method is None:
        return
    from urllib.parse import urlsplit

    try:
        urlsplit(method)  # a port out of range is the Init method check's to explain
    except ValueError as exc:
        raise UsageError(f"--init-method {method}: not a valid URL ({exc})") from None


def _existing_scripts(paths) -> list[str]:
    """A missing script is a usage error; an unreadable or broken one is a `fail` result."""
    import os

    for path in paths:
        if not os.path.exists(path):
            raise UsageError(f"--script {path}: no such file")
        if os.path.isdir(path):
            raise UsageError(f"--script {path}: is a directory, not a Python file")
    return list(paths)


def main(args: argparse.Namespace) -> int:
    if args.list_checks:
        return list_checks(json_out=args.json)
    options = options_from_args(args)
    if getattr(args, "ray", None) is not None:
        if not args.distributed:
            raise UsageError("--ray goes with --distributed: ddpdoctor doctor --distributed --ray")
        from ddpdoctor.distributed_doctor.on_ray import main as ray_main

        return ray_main(args)
    if args.distributed:
        from ddpdoctor.distributed_doctor.doctor import main as distributed_main

        return distributed_main(args, options)
    with progress_spinner(not args.json) as on_progress:
        report = run_checks(
            args.check_ids or None, options=options, strict=args.strict, on_progress=on_progress
        )
    emit_report(report, args)
    return int(report.exit_code)


def emit_report(report: DoctorReport, args: argparse.Namespace) -> None:
    if getattr(args, "junit_xml", None):
        from ddpdoctor.integrations.junit import write_junit

        write_junit(report, args.junit_xml)
    if args.json:
        sys.stdout.write(jsontext.dumps(report.to_json(), indent=2) + "\n")
        return
    console = make_console()
    render_report(report, console, verbose=args.verbose, symbols=symbols_for(sys.stdout))


def list_checks(*, json_out: bool) -> int:
    checks = all_checks()
    if json_out:
        rows = [
            {"id": c.id, "group": c.group, "title": c.title, "timeout_s": c.timeout_s}
            for c in checks
        ]
        sys.stdout.write(jsontext.dumps({"schema_version": 1, "checks": rows}, indent=2) + "\n")
        return int(ExitCode.OK)
    group = None
    width = max(len(c.id) for c in checks)
    for c in checks:
        if c.group != group:
            group = c.group
            print(f"{GROUP_TITLES[group]} ({group})")
        print(f"  {c.id:<{width}}  {c.title}")
    return int(ExitCode.OK)
