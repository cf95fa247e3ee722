"""pytest plugin: `pytest --ddpdoctor` runs the preflight checks as test items.

Installed with ddpdoctor (entry point `pytest11`), so it is loaded into every pytest run: it
imports nothing beyond pytest at load time and does nothing unless `--ddpdoctor` is given (the
`ddp_doctor` fixture runs the doctor only when a test asks for it).

    pytest --ddpdoctor                                  # every check, plus the project's tests
    pytest --ddpdoctor --ddpdoctor-checks=network,system --ddpdoctor-no-smoke
    pytest --ddpdoctor --ddpdoctor-strict               # warnings fail too

Each check is one item, `ddpdoctor::<check id>`: a failed check (or one that could not run)
fails, a skipped one skips, a passing one passes, and a warning passes with a DoctorWarning in
pytest's warnings summary (with --ddpdoctor-strict it fails). The doctor runs once per session,
when the first item or the `ddp_doctor` fixture needs it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from ddpdoctor.checks.model import CheckResult
    from ddpdoctor.checks.report import DoctorReport

_REPORT = pytest.StashKey["DoctorReport"]()


class DoctorWarning(UserWarning):
    """A preflight check that warned: the job may run, but see the fix."""


class CheckFailed(Exception):
    """Raised by an item whose check failed; shown as the check's summary, fix and details."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.summary)
        self.result = result


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddpdoctor", "DDP preflight checks (ddpdoctor)")
    group.addoption(
        "--ddpdoctor",
        action="store_true",
        default=False,
        help="run ddpdoctor's preflight checks as test items (one per check)",
    )
    group.addoption(
        "--ddpdoctor-checks",
        metavar="IDS",
        default=None,
        help="comma-separated check ids or groups to run (default: all), e.g. network,system",
    )
    group.addoption(
        "--ddpdoctor-no-smoke",
        action="store_true",
        default=False,
        help="skip the collective smoke test (it starts local ranks)",
    )
    group.addoption(
        "--ddpdoctor-strict",
        action="store_true",
        default=False,
        help="checks that warn fail, as `ddpdoctor doctor --strict`",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("ddpdoctor"):
        return
    config.addinivalue_line("markers", "ddpdoctor: a ddpdoctor preflight check item")
    _selected_checks(config)  # an unknown check id is a usage error before anything runs


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    # The checks hang off the session itself rather than a test file, so they appear even in a
    # project with no tests of its own, are counted in "collected N items", and -k / -m apply.
    report = yield
    if (
        isinstance(collector, pytest.Session)
        and collector.config.getoption("ddpdoctor")
        and report.passed
    ):
        doctor = DoctorCollector.from_parent(collector, name="ddpdoctor", nodeid="ddpdoctor")
        report.result.insert(0, doctor)  # preflight first
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT, None)
    if report is None:
        return
    from ddpdoctor.checks.render import summary_line

    terminalreporter.write_sep("-", "ddpdoctor")
    terminalreporter.write_line(summary_line(report).plain)


@pytest.fixture(scope="session")
def ddp_doctor(request: pytest.FixtureRequest) -> DoctorReport:
    """The doctor's report (a DoctorReport), run once per session and shared with the items."""
    return doctor_report(request.config)


def doctor_report(config: pytest.Config) -> DoctorReport:
    """Run the selected checks once per session; later calls return the same report."""
    cached = config.stash.get(_REPORT, None)
    if cached is not None:
        return cached
    import time

    from ddpdoctor.checks.context import CheckContext, DoctorOptions
    from ddpdoctor.checks.report import DoctorReport
    from ddpdoctor.checks.runner import run_check_list

    smoke = not config.getoption("ddpdoctor_no_smoke")
    context = CheckContext(options=DoctorOptions(smoke=smoke))
    start = time.monotonic()
    results = run_check_list(_selected_checks(config), context)
    report = DoctorReport.build(
        results,
        strict=bool(config.getoption("ddpdoctor_strict")),
        elapsed_s=time.monotonic() - start,
    )
    config.stash[_REPORT] = report
    return report


def _selected_checks(config: pytest.Config) -> list[Any]:
    from ddpdoctor.checks.registry import select_checks

    text = config.getoption("ddpdoctor_checks")
    ids = [part.strip() for part in text.split(",") if part.strip()] if text else None
    try:
        return select_checks(ids, smoke=not config.getoption("ddpdoctor_no_smoke"))
    except KeyError as exc:
        raise pytest.UsageError(
            f"--ddpdoctor-checks: unknown check or group {exc.args[0]!r} "
            "(see 'ddpdoctor doctor --list-checks')"
        ) from None


class DoctorCollector(pytest.Collector):
    def collect(self) -> list[pytest.Item]:
        return [
            DoctorItem.from_parent(self, name=check.id, check_id=check.id, title=check.title)
            for check in _selected_checks(self.config)
        ]


class DoctorItem(pytest.Item):
    def __init__(self, *, check_id: str, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check_id = check_id
        self.title = title
        self.add_marker("ddpdoctor")

    def runtest(self) -> None:
        from ddpdoctor.checks.model import Status

        report = doctor_report(self.config)
        result = report.by_id(self.check_id)
        if result.status in (Status.FAIL, Status.ERROR):
            raise CheckFailed(result)
        if result.status == Status.SKIP:
            pytest.skip(f"{self.check_id}: {result.summary}")
        if result.status == Status.WARN:
            if report.strict:
                raise CheckFailed(result)
            # Attributed to the check rather than to this line, so the warnings summary reads
            # "ddpdoctor::nccl.env: DoctorWarning: ...".
            warnings.warn_explicit(
                DoctorWarning(f"{result.summary} (fix: {result.fix})"),
                DoctorWarning,
                filename=f"ddpdoctor::{self.check_id}",
                lineno=0,
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed):
            result = excinfo.value.result
            lines = [f"{result.status.value}: {result.title}: {result.summary}"]
            if result.fix:
                lines.append(f"fix: {result.fix}")
            lines.extend(f"  {detail}" for detail in result.details)
            return "\n".join(lines)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"ddpdoctor {self.check_id}: {self.title}"
