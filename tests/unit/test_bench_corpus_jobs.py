"""benchmarks/corpus_jobs.py: every entry of every corpus becomes a job of the false-alarm
benchmark, with a command whose files exist, the verdict and culprits its own integration test
expects, and a name `--only` can pick it by (no job is started here)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.integration import test_replicas
from tests.procs import REPO, load_script

jobs = load_script("benchmarks/corpus_jobs.py")
bench = load_script("benchmarks/false_alarms.py")
HEALTHY = {j.name: j for j in jobs.healthy_jobs()}
FAULTY = {j.name: j for j in jobs.faulty_jobs()}
EVERY = {**HEALTHY, **FAULTY}
TOOLS = {"torchrun", "deepspeed", "python"}  # launchers resolved from this interpreter's bin


def _manifest(corpus: str) -> dict:
    return json.loads((REPO / "tests" / "corpus" / corpus / "corpus.json").read_text())


def test_job_names_are_unique_across_both_sets():
    assert len(EVERY) == len(jobs.healthy_jobs()) + len(jobs.faulty_jobs())


@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_job_command_names_files_that_exist(name):
    job = EVERY[name]
    if "--" not in job.args:  # the reference job: ddpdoctor's own flags
        assert job.args[:2] == jobs.REFERENCE, job.args
        return
    words = job.args[job.args.index("--") + 1 :]
    head = Path(words[0])
    assert head.is_file() or head.name in TOOLS or shutil.which(words[0]), words
    if head.is_file() and head.suffix != ".py":  # a tool from the venv: runnable
        assert os.access(head, os.X_OK), head
    paths = [Path(w) for w in words if w.endswith((".py", ".json", ".sh"))]
    assert paths and paths[0].is_absolute(), words  # a script of the repository, found anywhere
    # a relative path is its driver's argument (torchft's launcher): next to the driver
    missing = [p for p in paths if not (paths[0].parent / p).is_file()]
    assert not missing, (name, missing)


@pytest.mark.parametrize(
    ("corpus", "prefix", "builder"),
    [("deepspeed", "ds-", jobs.deepspeed_jobs), ("mismatch", "mismatch-", jobs.mismatch_jobs)],
)
def test_every_manifest_entry_is_a_job_with_its_verdict_and_culprits(corpus, prefix, builder):
    for kind, entries in _manifest(corpus).items():
        built = {j.name: j for j in builder(kind)}
        assert set(built) == {prefix + e["name"] for e in entries}
        target = HEALTHY if kind == "healthy" else FAULTY
        for entry in entries:
            job = target[prefix + entry["name"]]
            if kind == "paired_by_chance":  # out of step from the pairing on: rank 0 ends it
                assert job.verdicts == {"hang", "crash"} and job.culprits == (0,), job
                continue
            assert job.verdicts == {entry.get("verdict", "healthy")}, job
            assert job.culprits == tuple(entry.get("culprits", ())), job


def test_deepspeed_jobs_run_on_the_cpu_under_their_own_launcher_or_torchrun():
    for entry in [e for entries in _manifest("deepspeed").values() for e in entries]:
        job = EVERY["ds-" + entry["name"]]
        assert ("DS_ACCELERATOR", "cpu") in job.env
        assert bench._env(job)["DS_ACCELERATOR"] == "cpu"
        nproc = str(entry.get("nproc", 2))
        if entry["launcher"] == "deepspeed":
            assert job.flags == () and Path(job.args[1]).name == "deepspeed", job.args
            assert job.args[2:4] == ("--num_gpus", nproc) and job.args[4] == "--master_port"
        else:
            assert job.flags == ("--nproc", nproc) and job.args[1].endswith(entry["script"])
    # rank 0 evaluates alone: the hang it ends in, rank 0's, and the warning said on the way
    paired = FAULTY["ds-zero3-eval-rank0"]
    loud = ("hang", "collective.chance_pairing")
    assert bench.Outcome(paired, 1, "hang", (0,), loud, "hang", 40.0, 90).right
    assert bench.Outcome(paired, 1, "crash", (0,), ("crash", *loud[1:]), None, 1.0, 90).right
    assert not bench.Outcome(paired, 1, "hang", (0,), ("hang",), "hang", 40.0, 90).right
    assert not bench.Outcome(paired, 1, "hang", (1,), loud, "hang", 40.0, 90).right


def test_every_replica_script_is_a_job_with_the_expectations_of_its_integration_test():
    scripts = {Path(j.args[1]).name for n, j in EVERY.items() if n.startswith("replica-")}
    assert scripts == {p.name for p in jobs.REPLICAS.glob("*.py")}
    healthy = {Path(j.args[1]).name for n, j in HEALTHY.items() if n.startswith("replica-")}
    assert set(test_replicas.HEALTHY) | {test_replicas.DS_RELOAD} <= healthy
    for script, (culprits, _, _) in test_replicas.DIVERGING.items():
        job = next(j for n, j in FAULTY.items() if n.startswith("replica-") and script in j.args[1])
        assert job.verdicts == {"mismatch"} and job.culprits == tuple(culprits), job
    assert FAULTY["replica-deepspeed-zero2-reload-rank0"].culprits == (0,)
    assert HEALTHY["replica-deepspeed-zero2"].args[2:] == ("--healthy",)
    assert HEALTHY["replica-hsdp4"].flags == ("--nproc", "4")
    # a divergence on a healthy job is an alarm; expected by no replica job
    seeds = HEALTHY["replica-seeds"]
    assert bench.Outcome(seeds, 1, "mismatch", (0,), ("replicas.diverged",), None, 3, 9).false_alarm


@pytest.mark.parametrize("prefix", ["ds-", "mismatch-", "replica-"])
def test_only_picks_a_new_corpus_by_its_prefix_and_nothing_else(prefix):
    picked = [n for n in EVERY if prefix in n]
    assert picked and all(n.startswith(prefix) for n in picked), picked


def test_deepspeed_op_is_built_only_when_a_deepspeed_job_is_chosen(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("built without a DeepSpeed job")

    monkeypatch.setattr(bench.subprocess, "run", no_build)
    assert bench.build_deepspeed_op(
        [HEALTHY["replica-seeds"], FAULTY["mismatch-fsdp2-unit-run-on-rank0"]]
    )
    with pytest.raises(AssertionError, match="built without"):
        bench.build_deepspeed_op([HEALTHY["replica-deepspeed-zero2"]])
