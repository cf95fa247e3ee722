"""Run checks concurrently, each bounded in time, and collect them into a report in a fixed order.

Each check runs in its own daemon thread. A check still running at its deadline is reported as an
`error` result and abandoned: being a daemon, its thread cannot keep the process alive, so the
doctor never hangs on a DNS server that never answers or a driver call that never returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.model import CheckResult
from ddpdoctor.checks.registry import Check, select_checks
from ddpdoctor.checks.report import DoctorReport

ProgressCallback = Callable[
    [str, Check, CheckResult | None], None
]  # ("start"|"done", check, result)


def run_check_list(
    checks: Sequence[Check],
    ctx: CheckContext,
    *,
    on_progress: ProgressCallback | None = None,
    max_parallel: int = 16,
) -> list[CheckResult]:
    """Results in the order of `checks`, whatever order they finish in."""
    slots = threading.BoundedSemaphore(max_parallel)
    futures: list[tuple[Check, Future[CheckResult], list[float]]] = []
    lock = threading.Lock()

    def worker(check: Check, future: Future[CheckResult], started: list[float]) -> None:
        with slots:
            started.append(time.monotonic())
            if on_progress:
                _notify(on_progress, lock, "start", check, None)
            result = check(ctx)  # never raises: Check.__call__ turns exceptions into results
            if future.set_running_or_notify_cancel():
                future.set_result(result)
                if on_progress:
                    _notify(on_progress, lock, "done", check, result)

    for check in checks:
        future: Future[CheckResult] = Future()
        started: list[float] = []
        thread = threading.Thread(
            target=worker, args=(check, future, started), name=f"check:{check.id}", daemon=True
        )
        futures.append((check, future, started))
        thread.start()

    results: list[CheckResult] = []
    for check, future, started in futures:
        results.append(_await(check, future, started, lock, on_progress))
    return results


def _await(
    check: Check,
    future: Future[CheckResult],
    started: list[float],
    lock: threading.Lock,
    on_progress: ProgressCallback | None,
) -> CheckResult:
    # The deadline counts from when the check got a slot, not from when it was queued.
    while True:
        if future.done():
            return future.result()
        if started:
            remaining = started[0] + check.timeout_s - time.monotonic()
            if remaining <= 0:
                break
            try:
                return future.result(timeout=min(remaining, 0.25))
            except TimeoutError:
                continue
        time.sleep(0.005)
    future.cancel()
    result = check.error_result(
        f"timed out after {check.timeout_s:g} s (the check was abandoned; something it waits on "
        "does not answer)",
        duration_s=check.timeout_s,
    )
    if on_progress:
        _notify(on_progress, lock, "done", check, result)
    return result


def _notify(
    callback: ProgressCallback,
    lock: threading.Lock,
    what: str,
    check: Check,
    result: CheckResult | None,
) -> None:
    with lock:
        try:
            callback(what, check, result)
        except Exception:  # noqa: BLE001 - a broken progress display must not lose results
            pass


def run_checks(
    ids: list[str] | None = None,
    *,
    options: DoctorOptions | None = None,
    context: CheckContext | None = None,
    strict: bool = False,
    on_progress: ProgressCallback | None = None,
) -> DoctorReport:
    """Run the doctor: all checks (or those named by id or group) and return the report. The one
    runner behind `ddpdoctor doctor`, the doctor before `ddpdoctor run`, and the Python API.
    An unknown id or group raises UnknownCheckError (a UsageError).

    >>> from ddpdoctor import run_checks
    >>> report = run_checks(["launcher", "network"])
    >>> report.exit_code, report.counts
    """
    ctx = context or CheckContext(options=options or DoctorOptions())
    checks = select_checks(ids, smoke=ctx.options.smoke)
    start = time.monotonic()
    results = run_check_list(checks, ctx, on_progress=on_progress)
    if ctx.options.scripts:  # `--script`: the static checkup of the user's training scripts
        from ddpdoctor.checks.scriptcheck import script_results

        results = [*results, *script_results(ctx.options.scripts, no_gpu=_no_gpu(ctx))]
    return DoctorReport.build(results, strict=strict, elapsed_s=time.monotonic() - start)


def _no_gpu(ctx: CheckContext) -> str | None:
    """Why the job will see no GPU, for the checkup's GPU rule; None when unsure."""
    from ddpdoctor.checks.gpu_plan import no_gpu_reason

    try:
        return no_gpu_reason(ctx)
    except Exception:  # noqa: BLE001 - a failed probe is the GPU checks' to report
        return None
