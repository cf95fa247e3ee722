"""The framework corpus (tests/corpus/frameworks/corpus.json): Lightning, accelerate and the HF
Trainer, run for real as `ddpdoctor run --no-tui --json -- COMMAND` (2 gloo ranks on the CPU).

Healthy jobs must end healthy with no warning and their training steps counted on every rank
(step times included: what straggler detection and the adaptive hang threshold feed on), with
Lightning's phases and epochs. A rank that stalls in Lightning's `training_step` is named as a
hang of rank 1, a rank that is slow in it as a straggler; every other planted fault gets its
verdict, its culprit and the user's line.

All jobs start in one module fixture, a few at a time (Lightning's import is most of their time).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.procs import (
    REPO,
    TEARDOWN_ABORT,
    JsonRun,
    assert_healthy_unless_aborted_at_exit,
    clean_env,
    ddpdoctor_cmd,
    job_processes,
    run_json_jobs,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CORPUS = REPO / "tests" / "corpus" / "frameworks"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
HEALTHY = {job["name"]: job for job in MANIFEST["healthy"]}
FAULTY = {job["name"]: job for job in MANIFEST["faulty"]}
UNDISTRIBUTED = {job["name"]: job for job in MANIFEST["undistributed"]}
SLOW = {job["name"]: job for job in MANIFEST["slow"]}
PARALLEL = 3
RUN_TIMEOUT_S = 240
# a stalled rank is named within this many seconds of the stall (the hang floor once training
# started is 5 s; the rest is the monitor's confirmation on a loaded machine)
HANG_BOUND_S = 30.0


def command_of(job: dict) -> list[str]:
    """The manifest's command with its script made absolute and `python` / `torchrun` /
    `accelerate` taken from this interpreter's environment."""
    words = [str(CORPUS / w) if (CORPUS / w).is_file() else w for w in job["command"]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    tool = Path(sys.executable).parent / words[0]
    return [str(tool) if tool.exists() else words[0], *words[1:]]


class Result(JsonRun):
    def aborted_in_teardown(self, doc: dict) -> bool:
        """Every rank recorded a clean exit, and then one aborted in torch's C++ teardown (what
        its log says: the abort's message, and torchrun's SIGABRT for it)."""
        if not all(rank["exit_code"] == 0 for rank in doc["ranks"]):
            return False
        logs = "\n".join(
            path.read_text(errors="replace") for path in (self.run_dir / "logs").rglob("*.log")
        )
        return TEARDOWN_ABORT in logs and "SIGABRT" in logs

    def log_tail(self, lines: int = 40) -> str:
        """The end of the job's logs (a rank's fatal-error dump is there), for failure messages."""
        out = []
        for path in sorted((self.run_dir / "logs").rglob("*.log")):
            text = path.read_text(errors="replace").splitlines()
            kept = [line for line in text if "find_unused_parameters" not in line]
            out.append(f"--- {path.name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(out)


def _command(job: dict, work: Path) -> list[str]:
    return ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--json", "--run-dir", str(work / "run"),
        "--", *command_of(job),
    )  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    base = tmp_path_factory.mktemp("frameworks")
    jobs = [
        *MANIFEST["faulty"],
        *MANIFEST["slow"],
        *MANIFEST["healthy"],
        *MANIFEST["undistributed"],
    ]
    env = clean_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    yield run_json_jobs(
        {job["name"]: functools.partial(_command, job) for job in jobs}, base,
        parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S, env=env, result=Result,
    )  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_framework_job_is_healthy_with_its_steps_counted(results, name):
    r = results[name]
    doc = r.document()
    context = f"{name}: {r.stderr[-3000:]}\n{r.log_tail()}"
    assert_healthy_unless_aborted_at_exit(doc, r.returncode, r.aborted_in_teardown(doc), context)
    assert doc["job"]["stopped_for"] is None
    assert job_processes(r.run_dir) == []
    expected = HEALTHY[name]["steps"]
    assert sorted(rank["step"] for rank in doc["ranks"]) == [expected, expected], context
    for rank in (0, 1):
        steps = r.events(rank, "step")
        assert [s["step"] for s in steps] == list(range(1, expected + 1)), context
        assert all(s["step_time_s"] > 0 for s in steps), context


@pytest.mark.parametrize("name", [n for n in HEALTHY if n.startswith("lightning-")])
def test_lightning_phases_and_epochs_are_the_trainers(results, name):
    r = results[name]
    for rank in (0, 1):
        phases = [p["phase"] for p in r.events(rank, "phase")]
        assert phases == ["sanity_check", "train", "validate", "train", "validate"]
        epochs = [s["epoch"] for s in r.events(rank, "step")]
        assert epochs == [0] * 4 + [1] * 4


def test_hf_trainer_and_accelerate_steps_carry_their_epochs_and_phases(results):
    for name in ("hf-trainer-torchrun", "accelerate-torchrun-cpu"):
        for rank in (0, 1):
            epochs = [s["epoch"] for s in results[name].events(rank, "step")]
            assert epochs == [0] * 4 + [1] * 4, name
            phases = [p["phase"] for p in results[name].events(rank, "phase")]
            assert phases == ["train", "eval"] * 2, name


@pytest.mark.parametrize("name", list(FAULTY))
def test_planted_fault_gets_its_verdict_and_culprit(results, name):
    r = results[name]
    doc = r.document()
    expected = FAULTY[name]
    context = f"{name}: {doc.get('verdict')} {doc.get('culprits')}\n{r.stderr[-3000:]}"
    assert r.returncode == 1, context
    assert doc["verdict"] == expected["verdict"], context
    if expected.get("culprits_any"):  # every rank fails alike: the first one torchrun saw
        assert doc["culprits"] and set(doc["culprits"]) <= set(expected["culprits"]), context
    else:
        assert doc["culprits"] == expected["culprits"], context
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", list(FAULTY))
def test_planted_fault_is_traced_to_the_users_line(results, name):
    """The planted line is cited: in an error finding's evidence or summary, or in a culprit's
    stack."""
    doc = results[name].document()
    where = FAULTY[name]["line"]
    cited = {
        f"{Path(e.get('file') or '').name}:{e.get('line')}"
        for f in doc["findings"]
        if f["severity"] == "error"
        for e in f.get("evidence", [])
    }
    culprits = set(doc["culprits"])
    frames = [
        frame.split(" ")[0]
        for stack in doc["stacks"]
        if culprits & set(stack["ranks"])
        for frame in stack["frames"]
    ]
    said = any(where in f["summary"] for f in doc["findings"] if f["severity"] == "error")
    assert where in cited or where in frames or said, (sorted(cited), frames)


def test_a_rank_zero_only_lightning_barrier_is_rank_0s_at_its_call_site(results):
    """gloo pairs rank 0's extra `strategy.barrier()` with Lightning's next barrier on rank 1:
    the mismatch names the user's line, the hook it runs in and Lightning's frame below it."""
    r = results["lightning-barrier-rank0"]
    finding = next(f for f in r.document()["findings"] if f["id"] == "mismatch")
    line = int(FAULTY["lightning-barrier-rank0"]["line"].rpartition(":")[2])
    assert "rank 0 called barrier #" in finding["summary"], finding["summary"]
    assert (
        f"from lit_barrier_rank0.py:{line} LitRegressor.on_train_epoch_end via "
        "DDPStrategy.barrier; rank 1 never did" in finding["summary"]
    ), finding["summary"]
    evidence = finding["evidence"][0]
    assert evidence["file"].endswith("lit_barrier_rank0.py") and evidence["line"] == line


def test_gpu_code_on_a_machine_without_a_gpu_crashes_at_its_line(results):
    """GPU code as published, on this GPU-less machine: a crash headed by the ranks' exception
    at their line, before joining a process group, never "not started"."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the published GPU code runs")
    doc = results["gpu-code-on-cpu"].document()
    first = doc["findings"][0]
    assert first["id"] == "crash.before_init", doc["findings"]
    assert "Found no NVIDIA driver" in first["summary"]
    where = FAULTY["gpu-code-on-cpu"]["line"]
    assert f"{where} in ddp_setup, before joining a process group" in first["summary"]


def test_lightning_stalled_rank_is_named_as_a_hang_of_rank_1(results):
    """What ddpdoctor said live, before it stopped the job: HANG, culprit rank 1, within
    HANG_BOUND_S of the stall; the final verdict is the hang it stopped for, whatever Lightning's
    SIGTERM handler did afterwards."""
    r = results["lightning-stall-rank1"]
    assert r.document()["job"]["stopped_for"] == "hang", r.stderr[-3000:]
    named = re.search(r"HANG: culprit rank 1 \(detected ([0-9.]+) s after it started\)", r.stderr)
    assert named is not None, r.stderr[-3000:]
    assert float(named.group(1)) <= HANG_BOUND_S
    # training had started (steps recorded before the stall): the trained hang floor applied
    assert [s["step"] for s in r.events(0, "step")] == [1, 2]


@pytest.mark.parametrize("name", list(SLOW))
def test_a_slow_lightning_rank_is_named_a_straggler(results, name):
    """Straggler detection needs step times: a rank 0.3 s slower per step is named, and the job,
    slow but not stuck, runs to its healthy end."""
    r = results[name]
    doc = r.document()
    assert r.returncode == 0 and doc["verdict"] == "healthy", r.stderr[-3000:]
    stragglers = [f for f in doc["findings"] if f["id"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[SLOW[name]["straggler"]]], doc["findings"]
    steps = SLOW[name]["steps"]
    assert sorted(rank["step"] for rank in doc["ranks"]) == [steps, steps]


@pytest.mark.parametrize("name", list(UNDISTRIBUTED))
def test_a_launch_without_a_process_group_says_so_with_the_commands_exit_code(results, name):
    r = results[name]
    doc = r.document()
    assert r.returncode == UNDISTRIBUTED[name]["exit_code"], r.stderr[-3000:]
    assert doc["verdict"] != "not started"
    assert "never joined a process group" in r.stderr
