"""The FSDP corpus (tests/corpus/fsdp/corpus.json): FSDP2 (`fully_shard`), HSDP and tensor
parallelism with FSDP on DeviceMeshes, and DDP gradient accumulation, run for real as
`ddpdoctor run --no-tui --nproc N --json -- SCRIPT ARGS` (torchrun, gloo, CPU).

Healthy jobs must end healthy with no warning, with their training steps counted on every rank
and each FSDP collective recorded with its unit. Each planted break of the SPMD contract must
get its verdict, its culprit rank and a finding that cites the user's line (the `fully_shard`
line for a wrapping break); a contract that differs is named before the first collective.

All jobs start in one module fixture, a few at a time. (The healthy side of DDP's `no_sync()`
accumulation is the run corpus's recipe_no_sync.py.)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.procs import (
    REPO,
    JsonRun,
    assert_healthy_unless_aborted_at_exit,
    clean_env,
    ddpdoctor_cmd,
    exited_cleanly_then_aborted,
    job_processes,
    run_json_jobs,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CORPUS = REPO / "tests" / "corpus" / "fsdp"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
PARALLEL = 3
RUN_TIMEOUT_S = 300
HEALTHY = {job["name"]: job for job in MANIFEST["healthy"]}
FAULTY = {job["name"]: job for job in MANIFEST["faulty"]}


Result = JsonRun  # one finished `ddpdoctor run --json` job


def _command(job: dict, work: Path) -> list[str]:
    return ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", str(job["nproc"]), "--json",
        "--run-dir", str(work / "run"), "--", str(CORPUS / job["script"]), *job["args"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    jobs = [*MANIFEST["healthy"], *MANIFEST["faulty"]]
    return run_json_jobs(
        {job["name"]: functools.partial(_command, job) for job in jobs},
        tmp_path_factory.mktemp("fsdp"),
        parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S, env=clean_env({"OMP_NUM_THREADS": "1"}),
    )  # fmt: skip


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_job_is_healthy_without_warning_with_its_steps_counted(results, name):
    r = results[name]
    doc = r.document()
    context = f"{name}: {r.stderr[-3000:]}"
    logs = "\n".join(p.read_text(errors="replace") for p in (r.run_dir / "logs").rglob("*.log"))
    ranks = range(HEALTHY[name]["nproc"])
    aborted = exited_cleanly_then_aborted(r.run_dir, logs, ranks)
    assert_healthy_unless_aborted_at_exit(doc, r.returncode, aborted, context)
    assert doc["job"]["stopped_for"] is None, context
    assert len(doc["ranks"]) == len(ranks)
    assert all(rank["step"] and rank["step"] >= 2 for rank in doc["ranks"]), doc["ranks"]
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", ["fsdp2-1d", "hsdp-2x2", "tp-dp-2x2"])
def test_fsdp_collectives_carry_their_unit_and_its_fully_shard_line(results, name):
    starts = [e for e in results[name].events(0) if e["kind"] == "collective_start"]
    units = {e["unit"]["module"] for e in starts if "unit" in e}
    assert "(root)" in units and len(units) >= 3, units
    gathered = next(e for e in starts if e.get("unit", {}).get("module") not in (None, "(root)"))
    assert gathered["site"]["via"]["function"].startswith("fully_shard[")
    script = HEALTHY[name]["script"]
    assert gathered["site"]["file"].endswith(script)
    source = (CORPUS / script).read_text().splitlines()
    # the unit's wrapping line, and the user's line that ran the unit (a forward line)
    assert "fully_shard(" in source[gathered["unit"]["line"] - 1]
    assert gathered["site"]["via"]["line"] == gathered["unit"]["line"]
    assert "fully_shard(" not in source[gathered["site"]["line"] - 1]


def test_tensor_parallel_all_reduces_are_recorded_in_the_tp_group(results):
    starts = [e for e in results["tp-dp-2x2"].events(0) if e["kind"] == "collective_start"]
    tp = [e for e in starts if e["op"] == "all_reduce" and e["group"] != "default"]
    assert tp, "no functional all_reduce recorded"
    assert {e["group_size"] for e in tp} == {2}
    seqs = [e["seq"] for e in tp]
    assert seqs == sorted(seqs)


@pytest.mark.parametrize("name", list(FAULTY))
def test_planted_fault_gets_its_verdict_culprit_and_line(results, name):
    r = results[name]
    doc = r.document()
    expected = FAULTY[name]
    context = f"{name}: {json.dumps(doc['findings'])[:3000]}\n{r.stderr[-2000:]}"
    assert r.returncode == 1, context
    assert doc["verdict"] == expected["verdict"], context
    assert doc["culprits"] == expected["culprits"], context
    finding = next((f for f in doc["findings"] if f["id"] == expected["finding"]), None)
    assert finding is not None, context
    assert finding["severity"] == "error"
    cited = [
        e
        for e in finding["evidence"]
        if (e.get("file") or "").endswith(expected["script"]) and e.get("line") == expected["line"]
    ]
    assert cited, context
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", ["fsdp2-extra-wrap", "fsdp2-frozen-param"])
def test_a_differing_contract_is_written_before_the_first_collective(results, name):
    r = results[name]
    for rank in (0, 1):
        events = r.events(rank)
        kinds = [(e["kind"], e.get("code")) for e in events]
        if ("warning", "spmd.contract_mismatch") not in kinds:
            continue
        at = kinds.index(("warning", "spmd.contract_mismatch"))
        assert all(kind != "collective_start" for kind, _ in kinds[:at]), kinds[: at + 1]
        return
    pytest.fail("no rank wrote the contract mismatch")
