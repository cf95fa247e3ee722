"""The pipeline corpus (tests/corpus/pipelines/corpus.json): torch.distributed.pipelining
(PipelineStage with GPipe and 1F1B, a model cut into stages by layer ranges) and a pipeline
written by hand with send/recv, run for real as `ddpdoctor run --no-tui --nproc N --json --
SCRIPT ARGS` (torchrun, gloo, CPU).

Healthy jobs end healthy without a warning, with their pipeline recorded (schedule,
microbatches, stages) and their sends carrying the peer's global rank. Each planted fault gets
its verdict, culprits and a finding citing the user's line: a stalled stage is a hang of that
stage at the line it is stuck at, and the job is stopped; a schedule or microbatch count that
differs is a mismatch of the differing rank at the line that built its schedule (shapes two
neighbouring stages declared differently: both, at the line that made the stage); a send or
receive without its counterpart is a point-to-point deadlock naming the waiting call's line.
"""

from __future__ import annotations

import functools
import json
import subprocess
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
    run_in_parallel,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

CORPUS = REPO / "tests" / "corpus" / "pipelines"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
PARALLEL = 3
RUN_TIMEOUT_S = 300
HEALTHY = {job["name"]: job for job in MANIFEST["healthy"]}
FAULTY = {job["name"]: job for job in MANIFEST["faulty"]}


def _start(job: dict, base: Path) -> subprocess.Popen:
    work = base / job["name"]
    work.mkdir()
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", str(job["nproc"]), "--json",
        "--run-dir", str(work / "run"), "--", str(CORPUS / job["script"]), *job["args"],
    )  # fmt: skip
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),
        stderr=open(work / "stderr", "w"),
        env=clean_env({"OMP_NUM_THREADS": "1"}),
        cwd=work,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("pipelines")
    jobs = [*MANIFEST["healthy"], *MANIFEST["faulty"]]
    starts = {job["name"]: functools.partial(_start, job, base) for job in jobs}
    ended = run_in_parallel(starts, parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S)
    done: dict[str, JsonRun] = {}
    for name, (proc, timed_out) in ended.items():
        work = base / name
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[name] = JsonRun(proc.returncode, stdout, stderr, work / "run")
    return done


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_pipeline_is_healthy_without_warning(results, name):
    r = results[name]
    doc = r.document()
    context = f"{name}: {r.stderr[-3000:]}"
    logs = "\n".join(p.read_text(errors="replace") for p in (r.run_dir / "logs").rglob("*.log"))
    ranks = range(HEALTHY[name]["nproc"])
    aborted = exited_cleanly_then_aborted(r.run_dir, logs, ranks)
    # (no warning either: the helper checks that, unless torch's teardown aborted a rank)
    assert_healthy_unless_aborted_at_exit(doc, r.returncode, aborted, context)
    assert doc["job"]["stopped_for"] is None, context
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", ["pipe-gpipe", "pipe-1f1b", "split-1f1b"])
def test_the_pipeline_and_its_sends_are_recorded(results, name):
    r = results[name]
    for rank in (0, 1):
        events = r.events(rank)
        pipeline = next(e for e in events if e["kind"] == "pipeline")
        assert pipeline["stages"] == [rank] and pipeline["num_stages"] == 2
        assert pipeline["microbatches"] == 4
        assert pipeline["site"]["file"].endswith(HEALTHY[name]["script"])
        sends = [e for e in events if e["kind"] == "collective_start" and e.get("p2p")]
        assert sends and {e["peer"] for e in sends} == {1 - rank}
        beats = [e["pipeline"] for e in events if e["kind"] == "heartbeat" and "pipeline" in e]
        assert all(len(b) == 4 for b in beats)  # (a short job may end between two beats)
    doc = results[name].document()
    assert all(rank["step"] == 4 for rank in doc["ranks"]), doc["ranks"]


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


@pytest.mark.parametrize("name", ["pipe-stall", "split-stall", "handwritten-stall"])
def test_a_stalled_stage_is_stopped_within_a_hang_time(results, name):
    doc = results[name].document()
    assert doc["job"]["stopped_for"] == "hang", doc["job"]
    assert doc["detected_after_s"] is not None and doc["detected_after_s"] < 60


def test_a_stalled_pipelining_stage_is_named_with_its_stage_and_position(results):
    doc = results["pipe-stall"].document()
    hang = next(f for f in doc["findings"] if f["id"] == "hang")
    assert hang["summary"].startswith("rank 1 (pipeline stage 1/2) stopped answering"), hang
    assert " at step 6 F" in hang["summary"], hang


def test_a_differing_pipeline_is_written_before_the_first_send(results):
    for rank in range(3):
        kinds = [(e["kind"], e.get("code")) for e in results["pipe-microbatches"].events(rank)]
        if ("warning", "pipeline.contract_mismatch") not in kinds:
            continue
        at = kinds.index(("warning", "pipeline.contract_mismatch"))
        assert all(kind != "collective_start" for kind, _ in kinds[:at]), kinds[: at + 1]
        return
    pytest.fail("no rank wrote the pipeline contract mismatch")


def test_declared_shapes_that_differ_are_named_with_both_stages_before_the_first_send(results):
    r = results["static-shapes"]
    finding = next(f for f in r.document()["findings"] if f["id"] == "pipeline.contract_mismatch")
    assert "stage 0 (rank 0) sends [4, 24] float32" in finding["summary"], finding
    assert "stage 1 (rank 1) expects [16, 24] float32" in finding["summary"], finding
    for rank in (0, 1):  # the second of the two sides to arrive compares
        kinds = [(e["kind"], e.get("code")) for e in r.events(rank)]
        if ("warning", "pipeline.contract_mismatch") in kinds:
            at = kinds.index(("warning", "pipeline.contract_mismatch"))
            assert not [k for k, _ in kinds[:at] if k == "collective_start"], kinds[: at + 1]
            return
    pytest.fail("no rank wrote the shapes' difference")
