"""`ddpdoctor doctor`: run the preflight checks and report them as text, JSON or JUnit XML."""

from __future__ import annotations

import argparse
import json
import sys

from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.registry import GROUP_TITLES, Check, all_checks, select_checks
from ddpdoctor.checks.render import render_report
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_check_list
from ddpdoctor.console import make_console, symbols_for
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
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
    if args.distributed:
        from ddpdoctor.cluster.distributed_doctor import main as distributed_main

        return distributed_main(args)
    report = run_doctor(
        args.check_ids or None,
        options_from_args(args),
        strict=args.strict,
        show_progress=not args.json,
    )
    emit_report(report, args)
    return int(report.exit_code)


def run_doctor(
    ids: list[str] | None,
    options: DoctorOptions,
    *,
    strict: bool = False,
    show_progress: bool = True,
    context: CheckContext | None = None,
) -> DoctorReport:
    import time

    try:
        checks = select_checks(ids, smoke=options.smoke)
    except KeyError as exc:
        raise UsageError(
            f"unknown check or group {exc.args[0]!r} (see 'ddpdoctor doctor --list-checks')"
        ) from None
    ctx = context or CheckContext(options=options)
    start = time.monotonic()
    if show_progress and sys.stderr.isatty():
        results = _run_with_spinner(checks, ctx)
    else:
        results = run_check_list(checks, ctx)
    if options.scripts:
        from ddpdoctor.scriptcheck import script_results

        results = [*results, *script_results(options.scripts)]
    return DoctorReport.build(results, strict=strict, elapsed_s=time.monotonic() - start)


def _run_with_spinner(checks: list[Check], ctx: CheckContext):
    """On a terminal, a spinner on stderr names the slow checks still running."""
    console = make_console(sys.stderr)
    running: dict[str, Check] = {}
    with console.status("checking...", spinner="dots") as status:

        def progress(what: str, check: Check, _result) -> None:
            if what == "start":
                running[check.id] = check
            else:
                running.pop(check.id, None)
            slow = [c.title for c in running.values() if c.slow] or [
                c.title for c in running.values()
            ]
            status.update(f"checking: {', '.join(slow[:3])}" if slow else "checking...")

        return run_check_list(checks, ctx, on_progress=progress)


def emit_report(report: DoctorReport, args: argparse.Namespace) -> None:
    if getattr(args, "junit_xml", None):
        from ddpdoctor.junit import write_junit

        write_junit(report, args.junit_xml)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
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
        sys.stdout.write(json.dumps({"schema_version": 1, "checks": rows}, indent=2) + "\n")
        return int(ExitCode.OK)
    group = None
    width = max(len(c.id) for c in checks)
    for c in checks:
        if c.group != group:
            group = c.group
            print(f"{GROUP_TITLES[group]} ({group})")
        print(f"  {c.id:<{width}}  {c.title}")
    return int(ExitCode.OK)
