"""The smoke check with recorded rank outcomes: pass with bandwidth, hang, death, wrong data."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from ddpdoctor.checks import smoke, smoke_worker
from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.probes.smoke_model import (
    STEPS,
    Measurement,
    RankOutcome,
    SmokeReport,
    SmokeRequest,
    blame,
)

ALL = STEPS  # every step finished


def rank(r, finished=ALL, current=None, **kw) -> RankOutcome:
    current = current if current is not None else (finished[-1] if finished else None)
    return RankOutcome(rank=r, pid=1000 + r, finished=tuple(finished), current=current, **kw)


def report(*ranks, measurements=(), timed_out_step=None, backend="gloo") -> SmokeReport:
    stall = 15.0 if timed_out_step else None
    return SmokeReport(
        backend, len(ranks), tuple(ranks), tuple(measurements), 3.2, timed_out_step, stall
    )


UP_TO_BARRIER = ("import", "init", "barrier")


# --- bandwidth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("world", "factor"), [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_follows_nccl_tests(world, factor):
    m = Measurement(bytes=64 << 20, time_s=0.1)
    assert m.algbw_gbps() == pytest.approx((64 << 20) / 0.1 / 1e9)
    assert m.busbw_gbps(world) == pytest.approx(m.algbw_gbps() * factor)


def test_one_rank_reports_algbw_since_nothing_crosses_a_bus():
    sweep = (Measurement(8, 0.001, 20), Measurement(1 << 20, 0.002, 10))
    result = smoke.outcome_from_report(report(rank(0), measurements=sweep))
    assert result.status is Status.PASS
    assert "1 gloo rank:" in result.summary
    assert "algbw (one rank: no bus traffic) up to 0.52 GB/s (1 MiB)" in result.summary


def test_passing_report_has_sweep_facts_and_table():
    sweep = (Measurement(8, 0.001, 20), Measurement(1 << 20, 0.002, 10))
    result = smoke.outcome_from_report(report(rank(0), rank(1), measurements=sweep))
    assert result.status is Status.PASS
    assert "2 gloo ranks" in result.summary and "busbw up to 0.52 GB/s (1 MiB)" in result.summary
    assert result.facts["sweep"][1] == {
        "bytes": 1 << 20,
        "time_us": 2000.0,
        "iters": 10,
        "algbw_gbps": 0.5243,
        "busbw_gbps": 0.5243,
    }
    assert result.facts["peak_busbw_gbps"] == 0.5243
    assert result.details[0].split() == ["size", "time", "algbw", "busbw"]
    assert "1 MiB" in result.details[2] and "0.524 GB/s" in result.details[2]


# --- failures -------------------------------------------------------------------------------------


def test_a_rank_that_never_starts_a_step_is_the_culprit():
    hung = report(
        rank(0, UP_TO_BARRIER, current="all_reduce", killed=True),
        rank(1, UP_TO_BARRIER, killed=True),
        timed_out_step="all_reduce",
    )
    found = blame(hung)
    assert found is not None and found.ranks == (1,) and found.step == "all_reduce"
    result = smoke.outcome_from_report(hung)
    assert result.status is Status.FAIL
    assert "rank 1 never started all_reduce (last finished: barrier)" in result.summary
    assert "rank 0 was waiting in all_reduce" in result.details
    assert result.details[0].endswith("killed after 15 s without progress")
    assert result.facts["culprit_ranks"] == [1] and "NCCL_DEBUG=INFO" in result.fix


def test_ranks_stuck_inside_the_same_step_are_all_named():
    stuck = report(
        rank(0, UP_TO_BARRIER, current="all_reduce", killed=True),
        rank(1, UP_TO_BARRIER, current="all_reduce", killed=True),
        timed_out_step="all_reduce",
    )
    assert "ranks 0, 1 did not finish all_reduce" in smoke.outcome_from_report(stuck).summary


def test_a_dead_rank_is_blamed_not_the_peer_that_lost_it():
    died = report(
        rank(
            0,
            UP_TO_BARRIER,
            current="all_reduce",
            error_step="all_reduce",
            failed_at=2.40,
            error="RuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:3105",
        ),
        rank(1, UP_TO_BARRIER, exit_code=3, failed_at=2.45),
    )
    result = smoke.outcome_from_report(died)
    assert result.status is Status.FAIL
    assert result.summary.startswith("rank 1 exited with code 3 after barrier (before all_reduce)")
    assert any("rank 0 then failed in all_reduce: RuntimeError" in d for d in result.details)
    assert result.facts["culprit_ranks"] == [1]


def test_an_earlier_failure_wins_over_a_later_one():
    two = report(
        rank(
            0,
            ("import",),
            current="init",
            error_step="init",
            error="ValueError: bad",
            failed_at=1.0,
        ),
        rank(1, UP_TO_BARRIER, exit_code=-11, failed_at=5.0),
    )
    result = smoke.outcome_from_report(two)
    assert result.summary.startswith("rank 0 failed in init: ValueError: bad")
    assert result.facts["culprit_ranks"] == [0] and "Network results" in result.fix


def test_a_rank_killed_by_a_signal_says_so():
    out = report(rank(0), rank(1, ("import", "init"), exit_code=-9, failed_at=2.0))
    summary = smoke.outcome_from_report(out).summary
    assert summary.startswith("rank 1 was killed by signal 9 after init (before barrier)")


def test_wrong_data_names_the_element_and_suggests_p2p_on_nccl():
    wrong = report(
        rank(0),
        rank(
            1,
            UP_TO_BARRIER,
            current="all_reduce",
            error_step="all_reduce",
            failed_at=2.0,
            mismatch={
                "index": 515,
                "got": 1547.0,
                "expected": 1546.0,
                "wrong_elements": 1,
                "elements": 1031,
            },
        ),
        backend="nccl",
    )
    result = smoke.outcome_from_report(wrong)
    assert result.status is Status.FAIL
    assert (
        "rank 1 got a wrong result in all_reduce: element 515 is 1547.0, expected 1546.0"
        in result.summary
    )
    assert "NCCL_P2P_DISABLE=1" in result.fix


def test_import_failure_shows_the_rank_output():
    broken = report(
        rank(
            0,
            (),
            current="import",
            error_step="import",
            failed_at=0.5,
            error="ModuleNotFoundError: No module named 'torch'",
            output_tail="Traceback (most recent call last):\nModuleNotFoundError: x\n",
        ),
        rank(1, (), current="import", killed=True),
    )
    result = smoke.outcome_from_report(broken)
    assert "python -c 'import torch'" in result.fix
    assert "rank 0 output: ModuleNotFoundError: x" in result.details


# --- the check: rank count, backend, request ------------------------------------------------------


@dataclass
class FakeSmoke:
    installed: bool = True
    requests: list[SmokeRequest] = field(default_factory=list)

    def torch_installed(self):
        return self.installed

    def run(self, request):
        self.requests.append(request)
        ranks = [rank(r) for r in range(request.nproc)]
        return SmokeReport(request.backend, request.nproc, tuple(ranks), (), 1.0)


class FakeGpu:
    def __init__(self, count):
        self.count = count

    def facts(self):
        return SimpleNamespace(count=self.count)


def run_check(gpus=0, env=None, **options):
    probe = FakeSmoke()
    c = CheckContext(
        env=env or {},
        options=DoctorOptions(**options),
        probes=Probes(smoke=probe, gpu=FakeGpu(gpus)),
    )
    return smoke.collectives(c), probe.requests


@pytest.mark.parametrize(
    ("gpus", "options", "nproc", "backend"),
    [
        (0, {}, 2, "gloo"),
        (4, {}, 4, "nccl"),
        (4, {"backend": "gloo"}, 4, "gloo"),
        (0, {"nproc": 3}, 3, "gloo"),
        (8, {"nproc": 2}, 2, "nccl"),
    ],
)
def test_ranks_and_backend_are_chosen(gpus, options, nproc, backend):
    result, requests = run_check(gpus, **options)
    assert result.status is Status.PASS
    assert (requests[0].nproc, requests[0].backend) == (nproc, backend)


def test_the_job_environment_and_budget_reach_the_ranks():
    _, requests = run_check(env={"NCCL_DEBUG": "INFO"}, smoke_timeout_s=20.0)
    request = requests[0]
    assert request.env == {"NCCL_DEBUG": "INFO"}
    assert (request.timeout_s, request.init_timeout_s, request.step_timeout_s) == (20.0, 15.0, 5.0)


@pytest.mark.parametrize(
    ("gpus", "options", "needle"),
    [(0, {"backend": "nccl"}, "needs GPUs"), (2, {"nproc": 4}, "only 2 visible GPUs")],
)
def test_impossible_nccl_plans_fail_before_starting(gpus, options, needle):
    result, requests = run_check(gpus, **options)
    assert result.status is Status.FAIL and needle in result.summary and not requests


def test_no_smoke_and_no_torch():
    result, requests = run_check(smoke=False)
    assert result.status is Status.SKIP and not requests
    probe = FakeSmoke(installed=False)
    c = CheckContext(env={}, options=DoctorOptions(), probes=Probes(smoke=probe, gpu=FakeGpu(0)))
    assert smoke.collectives(c).status is Status.FAIL


# --- the worker's pure parts ----------------------------------------------------------------------


def test_fault_switch_applies_to_the_named_rank_only():
    fault = smoke_worker.Fault("wrong:rank=1,step=broadcast", rank=1)
    assert fault.corrupts("broadcast") and not fault.corrupts("all_reduce")
    assert not smoke_worker.Fault("wrong:rank=1,step=broadcast", rank=0).corrupts("broadcast")
    with pytest.raises(RuntimeError, match="fault injected into barrier"):
        smoke_worker.Fault("error:rank=0,step=barrier", rank=0).before("barrier")
    smoke_worker.Fault("", rank=0).before("barrier")  # no fault: returns


@pytest.mark.parametrize(("nbytes", "iters"), [(8, 20), (1 << 20, 10), (8 << 20, 4), (64 << 20, 2)])
def test_sweep_iterations_shrink_with_size(nbytes, iters):
    assert smoke_worker.iterations_for(nbytes) == iters
