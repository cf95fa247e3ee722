"""The check model, runner and report: ordering, time bounds, crashes turned into results."""

from __future__ import annotations

import threading
import time

import pytest

from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import CheckOutcome, Status, failed, passed, skipped, warning, worst
from ddpdoctor.checks.registry import Check
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_check_list
from ddpdoctor.exit_codes import ExitCode


def ctx() -> CheckContext:
    return CheckContext(env={}, options=DoctorOptions(smoke=False), probes=Probes())


def test_warn_and_fail_need_a_fix():
    with pytest.raises(ValueError):
        CheckOutcome(Status.WARN, "something", fix="")
    assert warning("x", fix="do y").fix == "do y"
    assert failed("x", fix="do y").status is Status.FAIL


def test_status_order_and_worst():
    order = sorted(Status, key=lambda s: s.severity)
    assert order == [Status.PASS, Status.SKIP, Status.WARN, Status.ERROR, Status.FAIL]
    chosen = worst([passed("a"), warning("b", fix="f"), skipped("c")])
    assert chosen is not None and chosen.summary == "b"


def test_a_check_that_raises_becomes_an_error_result():
    def boom(_ctx):
        raise RuntimeError("probe exploded")

    result = Check("system.boom", "Boom", boom)(ctx())
    assert result.status is Status.ERROR
    assert "RuntimeError: probe exploded" in result.summary
    assert result.fix


def test_a_check_returning_garbage_is_an_error():
    result = Check("system.bad", "Bad", lambda _c: "ok")(ctx())
    assert result.status is Status.ERROR


def test_runner_keeps_order_runs_concurrently_and_bounds_time():
    release = threading.Event()

    def slow(_c):
        time.sleep(0.3)
        return passed("slow done")

    def stuck(_c):
        release.wait(30)  # never released during the test: must be abandoned at its deadline
        return passed("never")

    checks = [
        Check("system.slow1", "Slow 1", slow),
        Check("system.stuck", "Stuck", stuck, timeout_s=0.5),
        Check("system.slow2", "Slow 2", slow),
        Check("system.fast", "Fast", lambda _c: passed("fast")),
    ]
    start = time.monotonic()
    results = run_check_list(checks, ctx())
    elapsed = time.monotonic() - start
    release.set()
    assert [r.id for r in results] == [c.id for c in checks]
    assert results[1].status is Status.ERROR and "timed out" in results[1].summary
    assert elapsed < 2.0, "slow checks must run concurrently and the stuck one be abandoned"


def test_progress_callback_sees_start_and_done_and_may_fail():
    seen = []

    def progress(what, check, result):
        seen.append((what, check.id))
        raise RuntimeError("a broken spinner must not lose results")

    results = run_check_list(
        [Check("system.fast", "Fast", lambda _c: passed("ok"))], ctx(), on_progress=progress
    )
    assert results[0].status is Status.PASS
    assert ("start", "system.fast") in seen and ("done", "system.fast") in seen


def _report(*statuses: Status, strict: bool = False) -> DoctorReport:
    results = []
    for i, status in enumerate(statuses):
        outcome = CheckOutcome(
            status, f"r{i}", fix="fix" if status in (Status.WARN, Status.FAIL) else None
        )
        results.append(Check(f"system.c{i}", f"C{i}", lambda _c, o=outcome: o)(ctx()))
    return DoctorReport.build(results, strict=strict)


def test_exit_codes_follow_the_contract():
    assert _report(Status.PASS, Status.SKIP).exit_code is ExitCode.OK
    assert _report(Status.PASS, Status.WARN).exit_code is ExitCode.OK
    assert _report(Status.PASS, Status.WARN, strict=True).exit_code is ExitCode.PROBLEMS
    assert _report(Status.FAIL).exit_code is ExitCode.PROBLEMS
    assert _report(Status.ERROR).exit_code is ExitCode.PROBLEMS


def test_report_json_has_the_documented_schema():
    data = _report(Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR).to_json()
    assert set(data) >= {
        "schema_version",
        "ddpdoctor_version",
        "host",
        "exit_code",
        "counts",
        "results",
    }
    assert data["schema_version"] == 1
    assert data["counts"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 1, "error": 1}
    assert data["exit_code"] == 1
    for result in data["results"]:
        assert set(result) >= {
            "id",
            "group",
            "title",
            "status",
            "summary",
            "details",
            "fix",
            "facts",
        }
        assert result["group"] == "system"


def test_facts_become_json_values():
    outcome = passed(
        "x", facts={"ids": (1, 2), "set": {"b", "a"}, "status": Status.PASS, "path": object()}
    )
    data = Check("system.f", "F", lambda _c: outcome)(ctx()).to_json()["facts"]
    assert data["ids"] == [1, 2] and data["set"] == ["a", "b"] and data["status"] == "pass"
    assert isinstance(data["path"], str)


def test_unknown_probe_names_are_rejected_and_given_probes_are_used():
    with pytest.raises(TypeError):
        Probes(nonsense=object())
    fake = object()
    assert Probes(gpu=fake).gpu is fake
