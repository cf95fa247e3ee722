"""Replicas that must agree, for real: the corpus of tests/corpus/replicas/ run as
`ddpdoctor run --no-tui --nproc 2 --json -- SCRIPT` (torchrun, 2 gloo ranks, 200 steps, exit 0).

Each diverging job must end in an error finding `replicas.diverged` that names the rank, the step
its replica began to differ and the line that made it differ, without the job being stopped;
the healthy job (per-rank dropout seeds, BatchNorm, rank-0-only evaluation) must get none. After
the fact, `ddpdoctor explain` of the run directory and of the per-rank checkpoints the scripts
save says whether the replicas agreed at the end.

The quick tier runs one job (a reload on rank 0 in a helper); the others are `slow`.
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
    clean_env,
    ddpdoctor_cmd,
    job_processes,
    run,
    run_in_parallel,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CORPUS = REPO / "tests" / "corpus" / "replicas"
RUN_TIMEOUT_S = 240
DIVERGING = {  # script -> (culprit ranks, the line cited, the step of the call)
    "reload_helper.py": ([0], "reload_helper.py:15", "at step 20"),
    "reload_inline.py": ([0], "reload_inline.py:29", "at step 20"),
    "sched_rank0.py": ([0], "sched_rank0.py:28", "from step 1"),
    "sched_continue.py": ([0], "sched_continue.py:34", "from step 1"),
}


def _start(script: str, base: Path, *extra: str) -> subprocess.Popen:
    work = base / Path(script).stem
    (work / "ckpt").mkdir(parents=True)
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", "2", "--json",
        "--run-dir", str(work / "run"), *extra, "--", str(CORPUS / script),
    )  # fmt: skip
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),
        stderr=open(work / "stderr", "w"),
        env=clean_env({"REPLICA_CKPT_DIR": str(work / "ckpt")}),
        cwd=work,
        start_new_session=True,
    )


def _run_all(base: Path, scripts: list[str], parallel: int) -> dict[str, JsonRun]:
    starts = {s: functools.partial(_start, s, base) for s in scripts}
    ended = run_in_parallel(starts, parallel=parallel, timeout_s=RUN_TIMEOUT_S)
    done = {}
    for script, (proc, timed_out) in ended.items():
        work = base / Path(script).stem
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[script] = JsonRun(proc.returncode, stdout, stderr, work / "run")
    return done


def explain(*paths: Path) -> tuple[int, list[dict]]:
    result = run(ddpdoctor_cmd("explain", "--json", *map(str, paths)), timeout=120)
    return result.returncode, json.loads(result.stdout)["findings"]


def assert_diverged(r: JsonRun, script: str) -> None:
    culprits, line, when = DIVERGING[script]
    doc = r.document()
    context = f"{script}: {r.stderr[-3000:]}"
    assert r.returncode == 1, context
    assert doc["verdict"] == "mismatch" and doc["culprits"] == culprits, context
    assert doc["job"]["torchrun_exit_code"] == 0 and doc["job"]["stopped_for"] is None, context
    finding = doc["findings"][0]
    assert finding["id"] == "replicas.diverged" and finding["severity"] == "error", finding
    assert finding["ranks"] == culprits
    assert f"rank {culprits[0]} called" in finding["summary"], finding["summary"]
    assert line in finding["summary"] and when in finding["summary"], finding["summary"]
    assert job_processes(r.run_dir) == []
    code, found = explain(r.run_dir)
    assert code == 1 and "replicas.diverged" in [f["id"] for f in found]
    ckpt = r.run_dir.parent / "ckpt"
    code, found = explain(ckpt / "rank-0.pt", ckpt / "rank-1.pt")
    assert code == 1 and [f["id"] for f in found] == ["replicas.checkpoints_differ"]


def test_a_reload_on_rank_0_in_a_helper_is_named_with_its_step_and_line(tmp_path):
    results = _run_all(tmp_path, ["reload_helper.py"], parallel=1)
    assert_diverged(results["reload_helper.py"], "reload_helper.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("replicas")
    scripts = [s for s in DIVERGING if s != "reload_helper.py"] + ["healthy_seeds.py"]
    return _run_all(base, scripts, parallel=2)


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in DIVERGING if s != "reload_helper.py"])
def test_each_diverging_job_is_an_error_naming_rank_step_and_line(corpus, script):
    assert_diverged(corpus[script], script)


@pytest.mark.slow
def test_the_healthy_job_with_per_rank_seeds_has_no_divergence(corpus):
    r = corpus["healthy_seeds.py"]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    assert not [f for f in doc["findings"] if f["id"].startswith("replicas.")]
    digests = r.events(0, "replica_digest")
    assert digests and any(d["buffers"] for d in digests)  # BatchNorm buffers compared too
    code, found = explain(r.run_dir)
    assert code == 0 and "replicas.agreed" in [f["id"] for f in found]
    ckpt = r.run_dir.parent / "ckpt"
    code, found = explain(ckpt / "rank-0.pt", ckpt / "rank-1.pt")
    assert code == 0 and [f["id"] for f in found] == ["replicas.agreed"]


@pytest.mark.slow
def test_stop_on_divergence_stops_the_job_when_asked(tmp_path):
    proc = _start("sched_rank0.py", tmp_path, "--stop-on-divergence")
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        from tests.procs import kill_group

        kill_group(proc)
    work = tmp_path / "sched_rank0"
    doc = json.loads((work / "stdout").read_text())
    assert proc.returncode == 1
    assert doc["verdict"] == "mismatch" and doc["job"]["stopped_for"] == "mismatch"
    assert "replicas.diverged" in [f["id"] for f in doc["findings"]]
