"""Replicas that must agree, for real: the corpus of tests/corpus/replicas/ run as
`ddpdoctor run --no-tui --nproc 2 --json -- SCRIPT` (torchrun, 2 gloo ranks, 200 steps, exit 0).

Each diverging job must end in an error finding `replicas.diverged` that names the rank, the step
its replica began to differ and the line that made it differ, without the job being stopped;
the healthy job (per-rank dropout seeds, BatchNorm, rank-0-only evaluation) must get none. After
the fact, `ddpdoctor explain` of the run directory and of the per-rank checkpoints the scripts
save says whether the replicas agreed at the end.

HSDP (FSDP2 over a (replicate, shard) mesh) and ZeRO-1 (torch's ZeroRedundancyOptimizer) run
the same way: an HSDP replicate group whose LR scheduler one rank steps diverges, a ZeRO job whose
scheduler one rank steps keeps identical replicas (each rank broadcasts the partition it owns)
but is found by its calls (`replicas.updates_differ`), and healthy jobs of both get no finding.
Four-rank HSDP (2x2: two replicate groups) compares each group apart. DeepSpeed's ZeRO-2 engine
heals like ZeRO-1: rank 0's restore of its "best" weights is found by its call, the same job
without it gets nothing.

The quick tier runs one job (a reload on rank 0 in a helper); the others are `slow`.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest

from tests.deepspeed_env import build_shared_memory_op, deepspeed_env, shm_buffers_removed
from tests.procs import (
    REPO,
    JsonRun,
    clean_env,
    ddpdoctor_cmd,
    exited_cleanly_then_aborted,
    job_processes,
    run,
    run_in_parallel,
)

# the slow tests' module fixtures start their jobs in the first test that asks (its timeout
# includes them): a few jobs, each a few minutes on a loaded 2-core machine
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

CORPUS = REPO / "tests" / "corpus" / "replicas"
RUN_TIMEOUT_S = 420
DIVERGING = {  # script -> (culprit ranks, the line cited, the step of the call)
    "reload_helper.py": ([0], "reload_helper.py:15", "at step 20"),
    "reload_inline.py": ([0], "reload_inline.py:29", "at step 20"),
    "sched_rank0.py": ([0], "sched_rank0.py:31", "from step 1"),
    "sched_continue.py": ([0], "sched_continue.py:34", "from step 1"),
    "hsdp_sched_rank0.py": ([0], "hsdp_sched_rank0.py:43", "from step 1"),
}
HEALTHY = ["healthy_seeds.py", "hsdp_healthy.py", "zero_healthy.py"]
ZERO_SCHED = "zero_sched_rank0.py"
ZERO_JOIN = "zero_join.py"  # uneven inputs under torch's Join: healthy, differing by design
HSDP_ZERO = ["hsdp_sched_rank0.py", "hsdp_healthy.py", ZERO_SCHED, "zero_healthy.py", ZERO_JOIN]
DS_RELOAD = "ds_reload_rank0.py"  # DeepSpeed ZeRO-2; --healthy: without the restore
# 4 ranks, HSDP 2x2: replicate groups {0, 2} and {1, 3}, each holding its own shards
FOUR_RANKS = {
    "hsdp4_sched": ("hsdp_sched_rank0.py", ("--mesh", "2x2"), {}),
    "hsdp4_healthy": ("hsdp_healthy.py", (), {"HSDP_SHARD": "2"}),
}


def _start(
    script: str,
    base: Path,
    *extra: str,
    name: str = "",
    nproc: int = 2,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    work = base / (name or Path(script).stem)
    (work / "ckpt").mkdir(parents=True)
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", str(nproc), "--json",
        "--run-dir", str(work / "run"), *extra, "--", str(CORPUS / script), *args,
    )  # fmt: skip
    return subprocess.Popen(
        cmd,
        stdout=open(work / "stdout", "w"),
        stderr=open(work / "stderr", "w"),
        env=clean_env({"REPLICA_CKPT_DIR": str(work / "ckpt"), **(env or {})}),
        cwd=work,
        start_new_session=True,
    )


def _run_all(
    base: Path, scripts: list[str], parallel: int, starts: dict | None = None
) -> dict[str, JsonRun]:
    starts = starts or {s: functools.partial(_start, s, base) for s in scripts}
    done = _finished(base, run_in_parallel(starts, parallel=parallel, timeout_s=RUN_TIMEOUT_S))
    for script, result in list(done.items()):
        if _aborted_at_exit(result):
            # torch's own teardown aborted a rank after its clean exit (docs/frameworks.md, "At
            # exit"): nothing these tests judge, and a healthy job's checks need its clean end.
            # The job runs once more; the first run's folder is kept beside it.
            work = result.run_dir.parent
            work.rename(work.with_name(work.name + "-aborted"))
            again = run_in_parallel({script: starts[script]}, parallel=1, timeout_s=RUN_TIMEOUT_S)
            done.update(_finished(base, again))
    return done


def _finished(base: Path, ended: dict) -> dict[str, JsonRun]:
    done = {}
    for script, (proc, timed_out) in ended.items():
        work = base / (Path(script).stem if script.endswith(".py") else script)
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[script] = JsonRun(proc.returncode, stdout, stderr, work / "run")
    return done


def _aborted_at_exit(r: JsonRun) -> bool:
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        return False
    return isinstance(doc, dict) and bool(doc.get("ranks")) and _torchrun_exit_code(r, doc) == 1


def explain(*paths: Path) -> tuple[int, list[dict]]:
    result = run(ddpdoctor_cmd("explain", "--json", *map(str, paths)), timeout=120)
    return result.returncode, json.loads(result.stdout)["findings"]


def _torchrun_exit_code(r: JsonRun, doc: dict) -> int:
    """0, the job's own: every rank exits cleanly. But torch's own teardown now and then aborts a
    rank that finished (docs/frameworks.md, "At exit"): torchrun then exits 1, and the replicas'
    verdict, reached before, stands."""
    logs = "\n".join(p.read_text(errors="replace") for p in (r.run_dir / "logs").rglob("*.log"))
    ranks = range(len(doc["ranks"]))
    return 1 if exited_cleanly_then_aborted(r.run_dir, f"{logs}\n{r.stderr}", ranks) else 0


def assert_diverged(r: JsonRun, script: str, peers: list[int] | None = None) -> None:
    culprits, line, when = DIVERGING[script]
    doc = r.document()
    context = f"{script}: {r.stderr[-3000:]}"
    assert r.returncode == 1, context
    assert doc["verdict"] == "mismatch" and doc["culprits"] == culprits, context
    assert doc["job"]["torchrun_exit_code"] == _torchrun_exit_code(r, doc), context
    assert doc["job"]["stopped_for"] is None, context
    finding = doc["findings"][0]
    assert finding["id"] == "replicas.diverged" and finding["severity"] == "error", finding
    assert finding["ranks"] == culprits
    assert f"rank {culprits[0]} called" in finding["summary"], finding["summary"]
    if peers is not None:  # one replicate group diverged, named as such
        assert f"replicate group ranks {peers[0]}, {peers[1]}" in finding["summary"]
    assert line in finding["summary"] and when in finding["summary"], finding["summary"]
    assert job_processes(r.run_dir) == []
    code, found = explain(r.run_dir)
    assert code == 1 and "replicas.diverged" in [f["id"] for f in found]
    ckpt = r.run_dir.parent / "ckpt"
    first, second = peers or [0, 1]  # 2x2 HSDP: ranks 0 and 1 saved the same gathered model
    code, found = explain(ckpt / f"rank-{first}.pt", ckpt / f"rank-{second}.pt")
    assert code == 1 and [f["id"] for f in found] == ["replicas.checkpoints_differ"]


def test_a_reload_on_rank_0_in_a_helper_is_named_with_its_step_and_line(tmp_path):
    results = _run_all(tmp_path, ["reload_helper.py"], parallel=1)
    assert_diverged(results["reload_helper.py"], "reload_helper.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("replicas")
    scripts = [s for s in DIVERGING if s != "reload_helper.py" and s not in HSDP_ZERO]
    return _run_all(base, [*scripts, "healthy_seeds.py"], parallel=2)


@pytest.fixture(scope="module")
def hsdp_zero(tmp_path_factory) -> dict[str, JsonRun]:
    return _run_all(tmp_path_factory.mktemp("replicas_hsdp_zero"), HSDP_ZERO, parallel=2)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> dict[str, JsonRun]:
    base = tmp_path_factory.mktemp("replicas4")
    starts = {
        name: functools.partial(_start, script, base, name=name, nproc=4, args=args, env=env)
        for name, (script, args, env) in FOUR_RANKS.items()
    }
    return _run_all(base, [], parallel=1, starts=starts)


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in DIVERGING if s != "reload_helper.py"])
def test_each_diverging_job_is_an_error_naming_rank_step_and_line(request, script):
    runs = request.getfixturevalue("hsdp_zero" if script in HSDP_ZERO else "corpus")
    assert_diverged(runs[script], script)


@pytest.mark.slow
@pytest.mark.parametrize("script", HEALTHY)
def test_each_healthy_job_has_no_divergence(request, script):
    """Per-rank seeds, BatchNorm, rank-0-only evaluation (DDP); HSDP and ZeRO written in other
    styles (a helper that shards, gradients averaged by hand): nothing said, replicas agreed."""
    r = request.getfixturevalue("hsdp_zero" if script in HSDP_ZERO else "corpus")[script]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    assert not [f for f in doc["findings"] if f["id"].startswith("replicas.")]
    digests = r.events(0, "replica_digest")
    assert len([d for d in digests if not d["final"]]) >= 2, digests
    if script == "healthy_seeds.py":
        assert any(d["buffers"] for d in digests)  # BatchNorm buffers compared too
    else:
        kind = "hsdp" if script.startswith("hsdp") else "zero"
        assert {d["replica"] for d in digests} == {kind}
    code, found = explain(r.run_dir)
    assert code == 0 and "replicas.agreed" in [f["id"] for f in found], found
    ckpt = r.run_dir.parent / "ckpt"
    code, found = explain(ckpt / "rank-0.pt", ckpt / "rank-1.pt")
    assert code == 0 and [f["id"] for f in found] == ["replicas.agreed"]


@pytest.mark.slow
def test_uneven_inputs_under_join_are_healthy_though_the_replicas_differ_between_its_syncs(
    hsdp_zero,
):
    """Join([model, zero_optimizer]) around each epoch, 10 and 16 batches: the ranks' steps part
    and their replicas differ until Join's sync, by design. No due-step digest after the first
    Join (runtime/join_hooks.py), the final ones agree, and nothing is said of the uneven
    loaders either."""
    r = hsdp_zero[ZERO_JOIN]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    assert [f["id"] for f in doc["findings"] if f["severity"] != "info"] == [], doc["findings"]
    assert sorted(rank["step"] for rank in doc["ranks"]) == [40, 64]  # 4 epochs of 10 and 16
    for rank in (0, 1):
        digests = r.events(rank, "replica_digest")
        assert [d["final"] for d in digests] == [True], digests
        assert all(e["join"] for e in r.events(rank, "epoch"))
    assert (
        r.events(0, "replica_digest")[0]["digests"] == r.events(1, "replica_digest")[0]["digests"]
    )


@pytest.mark.slow
def test_a_zero_scheduler_on_rank_0_alone_is_named_though_the_replicas_agree(hsdp_zero):
    r = hsdp_zero[ZERO_SCHED]
    doc = r.document()
    context = r.stderr[-3000:]
    assert r.returncode == 1 and doc["verdict"] == "mismatch" and doc["culprits"] == [0], context
    assert doc["job"]["torchrun_exit_code"] == _torchrun_exit_code(r, doc), context
    assert doc["job"]["stopped_for"] is None
    finding = doc["findings"][0]
    assert finding["id"] == "replicas.updates_differ" and finding["severity"] == "error"
    summary = finding["summary"]
    assert "rank 0 called ExponentialLR.step at zero_sched_rank0.py:34" in summary, summary
    assert "from step 1 (rank 1 never did)" in summary, summary
    assert not [f for f in doc["findings"] if f["id"] == "replicas.diverged"]
    code, found = explain(r.run_dir)
    assert code == 1 and "replicas.updates_differ" in [f["id"] for f in found]
    ckpt = r.run_dir.parent / "ckpt"  # the saved models are the same: ZeRO synced them
    code, found = explain(ckpt / "rank-0.pt", ckpt / "rank-1.pt")
    assert code == 0 and [f["id"] for f in found] == ["replicas.agreed"]


@pytest.mark.slow
def test_four_rank_hsdp_compares_each_replicate_group_apart(four_ranks):
    """2x2: ranks 0 and 1 hold different shards and must not be compared; the group of rank 0
    (ranks 0, 2) diverges when rank 0 alone steps its scheduler, the healthy job not at all."""
    assert_diverged(four_ranks["hsdp4_sched"], "hsdp_sched_rank0.py", peers=[0, 2])
    r = four_ranks["hsdp4_healthy"]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    assert not [f for f in doc["findings"] if f["id"].startswith("replicas.")]
    assert {tuple(d["peers"]) for d in r.events(1, "replica_digest")} == {(1, 3)}
    code, found = explain(r.run_dir)
    agreed = [f for f in found if f["id"] == "replicas.agreed"]
    assert code == 0 and len(agreed) == 2, found  # one per replicate group


@pytest.mark.slow
def test_stop_on_divergence_stops_the_job_when_asked(tmp_path):
    # a job long enough to be stopped (2000 steps of 10 ms): 200 fast steps may all be done by
    # the time the watcher reads the first differing digests
    proc = _start(
        "sched_rank0.py",
        tmp_path,
        "--stop-on-divergence",
        env={"REPLICA_STEPS": "2000", "REPLICA_STEP_S": "0.01"},
    )
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        from tests.procs import kill_group

        kill_group(proc)
    work = tmp_path / "sched_rank0"
    doc = json.loads((work / "stdout").read_text())
    assert proc.returncode == 1, doc
    assert doc["verdict"] == "mismatch" and doc["job"]["stopped_for"] == "mismatch"
    assert "replicas.diverged" in [f["id"] for f in doc["findings"]]


@pytest.fixture(scope="module")
def deepspeed_zero(tmp_path_factory) -> dict[str, JsonRun]:
    """DeepSpeed ZeRO-2 (its optimizer from the config), rank 0 restoring its "best" weights
    alone at step 13, and the same job without the restore."""
    pytest.importorskip("deepspeed")
    base = tmp_path_factory.mktemp("replicas_deepspeed")
    build_shared_memory_op()  # once, in the jobs' environment (tests/deepspeed_env.py)
    ds_env = deepspeed_env()
    env = {k: ds_env[k] for k in ("PATH", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR")}
    starts = {
        "ds-reload": functools.partial(_start, DS_RELOAD, base, name="ds-reload", env=env),
        "ds-healthy": functools.partial(
            _start, DS_RELOAD, base, name="ds-healthy", args=("--healthy",), env=env
        ),
    }
    with shm_buffers_removed():
        return _run_all(base, [], parallel=2, starts=starts)


@pytest.mark.slow
def test_a_deepspeed_zero2_restore_on_rank_0_alone_is_named_at_its_line(deepspeed_zero):
    """ZeRO-2 all-gathers the owners' partitions after every step: the replicas agree again, the
    model is a mix. The engine's digests carry the calls: rank 0's load_state_dict, its line,
    its step."""
    r = deepspeed_zero["ds-reload"]
    doc = r.document()
    context = r.stderr[-3000:]
    assert r.returncode == 1 and doc["verdict"] == "mismatch" and doc["culprits"] == [0], context
    assert doc["job"]["stopped_for"] is None
    finding = doc["findings"][0]
    assert finding["id"] == "replicas.updates_differ" and finding["severity"] == "error"
    summary = finding["summary"]
    assert "rank 0 called Sequential.load_state_dict at ds_reload_rank0.py:35" in summary, summary
    assert "at step 13 (rank 1 never did)" in summary, summary
    assert {d["replica"] for d in r.events(1, "replica_digest")} == {"zero"}


@pytest.mark.slow
def test_a_healthy_deepspeed_zero2_job_has_no_replica_finding(deepspeed_zero):
    r = deepspeed_zero["ds-healthy"]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    assert not [f for f in doc["findings"] if f["id"].startswith("replicas.")]
    assert len([d for d in r.events(0, "replica_digest") if not d["final"]]) >= 2
    code, found = explain(r.run_dir)
    assert code == 0 and "replicas.agreed" in [f["id"] for f in found], found
