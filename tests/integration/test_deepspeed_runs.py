"""The DeepSpeed corpus (tests/corpus/deepspeed/corpus.json): ZeRO-2 and ZeRO-3 jobs on CPU
(`DS_ACCELERATOR=cpu`, a plain torch optimizer), two scripts in two styles, and pipeline-engine
jobs in three (`PipelineModule`, `train_batch()`: ds_pipe.py; ds_pipe_tutorial.py as DeepSpeed's
tutorial writes it; ds_pipe_gpt.py as Megatron-DeepSpeed does), of 2 stages on 2 ranks or of 2
stages x 2 replicas on 4 (an entry's "nproc"), run for real under DeepSpeed's own launcher
(`ddpdoctor run -- deepspeed --num_gpus N SCRIPT`) and under torchrun (`--nproc N`).

Healthy jobs end healthy without a warning, every rank at its last step (the engine's forward
opens a step: the loops feed tensors to no DDP module). A stalled rank is a hang of that rank at
the line it is stuck at, stopped; a rank that raises is a crash of that rank at its line. Rank 0
evaluating alone under ZeRO-3 makes all-gathers rank 1 never makes; they pair by chance with
rank 1's training all-gathers of the same size, and that is reported with both lines and the
step it happened at, before the job ends.

DeepSpeed on CPU loads a shared-memory op it compiles once (into a build folder of the venv's own); the
fixture builds it first, in the jobs' own environment (tests/deepspeed_env.py says why).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.deepspeed_env import (
    PYTHON,
    VENV_BIN,
    build_shared_memory_op,
    deepspeed_env,
    shm_buffers_removed,
)
from tests.procs import (
    REPO,
    JsonRun,
    assert_healthy_unless_aborted_at_exit,
    exited_cleanly_then_aborted,
    free_port,
    job_processes,
    run_in_parallel,
)

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

CORPUS = REPO / "tests" / "corpus" / "deepspeed"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
PARALLEL = 2
RUN_TIMEOUT_S = 420
HEALTHY = {job["name"]: job for job in MANIFEST["healthy"]}
FAULTY = {job["name"]: job for job in MANIFEST["faulty"]}
PAIRED = {job["name"]: job for job in MANIFEST["paired_by_chance"]}
# a status line of the live job (ddpdoctor/tell: "<verdict> · <seconds> s · ..."), not the report
LIVE_STATUS = re.compile(r"^[a-z]+ · \d+ s · ", re.MULTILINE)
VERDICT_REPORT = re.compile(r"^(HANG|MISMATCH|CRASH): culprit", re.MULTILINE)


def _start(job: dict, base: Path) -> subprocess.Popen:
    work = base / job["name"]
    work.mkdir()
    script = str(CORPUS / job["script"])
    args = [str(CORPUS / a) if a.endswith(".json") else a for a in job["args"]]
    head = [PYTHON, "-m", "ddpdoctor", "run", "--no-tui", "--no-doctor", "--json"]
    head += ["--run-dir", str(work / "run")]
    nproc = str(job.get("nproc", 2))  # 4: a pipeline of 2 stages x 2 data-parallel replicas
    if job["launcher"] == "deepspeed":
        launcher = [str(VENV_BIN / "deepspeed"), "--num_gpus", nproc]
        cmd = [*head, "--", *launcher, "--master_port", str(free_port()), script, *args]
    else:
        cmd = [*head, "--nproc", nproc, "--", script, *args]
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),
        stderr=open(work / "stderr", "w"),
        env=deepspeed_env(),
        cwd=work,
        start_new_session=True,
    )


def _selected(request: pytest.FixtureRequest) -> set[str]:
    """The jobs the selected tests read (`-k`): the others are not started."""
    return {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and "name" in getattr(getattr(item, "callspec", None), "params", {})
    }


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> dict[str, JsonRun]:
    build_shared_memory_op()
    base = tmp_path_factory.mktemp("deepspeed")
    jobs = [*MANIFEST["healthy"], *MANIFEST["faulty"], *MANIFEST["paired_by_chance"]]
    wanted = _selected(request)
    jobs = [job for job in jobs if job["name"] in wanted]
    starts = {job["name"]: functools.partial(_start, job, base) for job in jobs}
    with shm_buffers_removed():
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


def _context(name: str, r: JsonRun) -> str:
    doc = json.loads(r.stdout) if r.stdout.strip() else {}
    return f"{name}: {json.dumps(doc.get('findings'))[:3000]}\n{r.stderr[-2500:]}"


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_zero_job_is_healthy_without_warning_at_its_last_step(results, name):
    r = results[name]
    doc = r.document()
    context = _context(name, r)
    logs = "\n".join(p.read_text(errors="replace") for p in (r.run_dir / "logs").rglob("*.log"))
    nproc = HEALTHY[name].get("nproc", 2)
    # (DeepSpeed's launcher prints the ranks' output, and its own, on ddpdoctor's stderr)
    aborted = exited_cleanly_then_aborted(r.run_dir, f"{logs}\n{r.stderr}", range(nproc))
    # (no warning either: the helper checks that, unless torch's teardown aborted a rank)
    assert_healthy_unless_aborted_at_exit(doc, r.returncode, aborted, context)
    assert doc["job"]["stopped_for"] is None, context
    assert [rank["step"] for rank in doc["ranks"]] == [12] * nproc, (doc["ranks"], context)
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", ["zero3-torchrun", "regression-zero3-launcher"])
def test_zero3_gathers_are_recorded_at_the_users_forward(results, name):
    r = results[name]
    script = HEALTHY[name]["script"]
    for rank in (0, 1):
        starts = r.events(rank, "collective_start")
        gathers = [e for e in starts if e["op"].startswith("all_gather")]
        assert gathers, {e["op"] for e in starts}
        sites = {
            (Path(e["site"]["file"]).name, e["site"]["line"]) for e in gathers if e.get("site")
        }
        assert any(file == script for file, _ in sites), sites


@pytest.mark.parametrize("name", list(FAULTY))
def test_planted_fault_gets_its_verdict_culprit_and_line(results, name):
    r = results[name]
    doc = r.document()
    expected = FAULTY[name]
    context = _context(name, r)
    assert r.returncode == 1, context
    assert doc["verdict"] == expected["verdict"], context
    assert doc["culprits"] == expected["culprits"], context
    where = f"{expected['script']}:{expected['line']}"
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    said = [
        f
        for f in errors
        if where in f["summary"]
        or any(where in e["text"] or (
            Path(e.get("file") or "").name == expected["script"] and e.get("line") == expected["line"]
        ) for e in f["evidence"])
    ]  # fmt: skip
    assert said, context
    if expected["verdict"] == "hang":
        assert doc["job"]["stopped_for"] == "hang", doc["job"]
        assert doc["detected_after_s"] is not None and doc["detected_after_s"] < 60
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", list(PAIRED))
def test_rank0s_eval_gathers_paired_by_chance_are_reported_with_both_lines_and_the_step(
    results, name
):
    r = results[name]
    doc = r.document()
    job = PAIRED[name]
    context = _context(name, r)
    found = [f for f in doc["findings"] if f["id"] == "collective.chance_pairing"]
    assert found, context
    summary = found[0]["summary"]
    assert found[0]["severity"] == "warning" and found[0]["ranks"] == [0], summary
    assert f"{job['script']}:{job['eval_line']}" in summary, summary
    assert f"{job['script']}:{job['train_line']}" in summary, summary
    assert f" at step {job['step']}," in summary, summary
    # said while the job ran, not only at the end: before the first verdict report (the close
    # prints a problem's report before its findings; one printed live came at once, before the
    # problem), or followed by a status line of the live job ("running · 41 s · ...", "crash ·
    # 71 s · ..." after a live report) before the closing one. Either way: the job's last 20 steps
    # may pass within one status period (0.024 s a step once DeepSpeed has started).
    said = re.search(r"paired by chance", r.stderr)
    assert said is not None, r.stderr[-3000:]
    reports = list(VERDICT_REPORT.finditer(r.stderr))
    before_problem = bool(reports) and said.end() < reports[0].start()
    closing = reports[-1].start() if reports else len(r.stderr)
    followed = LIVE_STATUS.search(r.stderr, said.end(), closing) is not None
    assert before_problem or followed, r.stderr[-3000:]
    assert job_processes(r.run_dir) == []
