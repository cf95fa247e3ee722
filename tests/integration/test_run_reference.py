"""`ddpdoctor run` of the reference job with real torchrun on 2 gloo ranks: a healthy run, and the
trail each injected fault leaves in the run directory. The runs are the session's shared runs
(tests/integration/conftest.py; test_diagnose_jobs checks their verdicts), one per scenario."""

from __future__ import annotations

import json
import stat
import statistics
from pathlib import Path

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime.ddp_hooks import COMM_READ_EVERY_S
from tests.integration.conftest import Result, SharedRuns
from tests.procs import clean_env, ddpdoctor_cmd, job_processes, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data-cache")


def shared(runs: SharedRuns, name: str) -> tuple[Result, Path]:
    result = runs[name]
    return result, result.run_dir


def events(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [e for e in map(parse_event_line, lines) if e is not None]


def of_kind(evs: list[dict], kind: str) -> list[dict]:
    return [e for e in evs if e["kind"] == kind]


# How far a step's forward, as its event tells it (its end less its time, plus its data wait),
# may be from when the runtime took it.
MARK_SLACK_S = 0.02


def _forward_t(step: dict) -> float:
    return step["mono"] - step["step_time_s"] + step["data_time_s"]


def diagnosis(run_dir: Path) -> dict:
    return json.loads((run_dir / "diagnosis.json").read_text())


# -- healthy ---------------------------------------------------------------------------------


@pytest.fixture
def healthy(shared_runs) -> tuple[Result, Path]:
    return shared(shared_runs, "reference-healthy")  # --steps 12


def test_healthy_run_exits_0_with_its_verdict(healthy):
    result, run_dir = healthy
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verdict: healthy (exit code 0)" in result.stdout
    assert f"run directory: {run_dir}" in result.stdout
    assert "[default0]:step 12/12" in result.stdout  # the job's own output passes through
    assert diagnosis(run_dir)["verdict"] == "healthy"


def test_healthy_run_leaves_every_ranks_events(healthy):
    _, run_dir = healthy
    starts = {}
    for rank in (0, 1):
        evs = events(run_dir, rank)
        assert of_kind(evs, "hello")[0]["world_size"] == 2
        steps = of_kind(evs, "step")
        assert [s["step"] for s in steps] == list(range(1, 13))
        # The split of the gradient all-reduce's wait comes from DDP's timers, first read at the
        # first forward COMM_READ_EVERY_S after the first: the steps that ended before have
        # none, every step whose forward came after has one (how many: the machine's step time
        # says; 12 steps of 55 ms or more leave fewer than 8 split). The first forward itself
        # is known only between its data's arrival and the first step's end (on a busy
        # machine the first step's set-up between the two took more than the slack).
        split = [s for s in steps if s["comm_wait_s"] is not None]
        assert steps[len(steps) - len(split) :] == split, steps
        first_at_least, first_at_most = _forward_t(steps[0]), steps[0]["mono"]
        for s in steps:
            if _forward_t(s) >= first_at_most + COMM_READ_EVERY_S + MARK_SLACK_S:
                assert s in split, (_forward_t(s) - first_at_most, s)
            elif s["mono"] < first_at_least + COMM_READ_EVERY_S - MARK_SLACK_S:
                assert s not in split, (s["mono"] - first_at_least, s)
        for s in steps[1:]:
            for field in ("step_time_s", "data_time_s"):
                assert s[field] is not None and s[field] >= 0, (field, s)
            assert s["samples_per_s"] > 0
            if s in split:
                assert s["compute_time_s"] >= 0 and s["comm_wait_s"] >= 0, s
            else:
                assert s["compute_time_s"] is None, s
        losses = [m["loss"] for m in of_kind(evs, "metrics") if "loss" in m]
        assert len(losses) == 12
        starts[rank] = [(e["op"], e["seq"]) for e in of_kind(evs, "collective_start")]
        assert len(of_kind(evs, "collective_end")) == len(starts[rank])
        assert of_kind(evs, "exit")[-1]["code"] == 0
        phases = [p["phase"] for p in of_kind(evs, "phase")]
        assert phases == ["data", "train", "checkpoint", "eval", "verify", "shutdown"]
        # DDP keeps its C++ all-reduce: the buckets are in the flight recorder, not events
        hello = of_kind(evs, "hello")[-1]
        assert hello["buckets"]["mode"] == "flight_recorder"
        assert not [e for e in of_kind(evs, "collective_start") if "bucket" in e]
    # the same collectives, in the same order, on both ranks; DDP's gradient syncs are a count
    # each rank writes when its heartbeat flushes (which numbers come out depends on the flush),
    # so they agree by the number reached
    syncs = {r: [seq for op, seq in starts[r] if op == "ddp_gradient_sync"] for r in starts}
    for r in starts:
        assert syncs[r] == sorted(set(syncs[r])), syncs[r]
    assert syncs[0][-1] == syncs[1][-1] >= 12
    calls = {r: [c for c in starts[r] if c[0] != "ddp_gradient_sync"] for r in starts}
    assert calls[0] == calls[1]


def test_healthy_run_passes_the_parameter_check(healthy):
    result, run_dir = healthy
    assert "[default0]:parameters identical on all 2 ranks" in result.stdout
    for rank in (0, 1):
        checks = [m for m in of_kind(events(run_dir, rank), "metrics") if "params_identical" in m]
        assert checks and checks[-1]["params_identical"] is True
    assert (run_dir / "checkpoint" / "reference-model.pt").stat().st_size > 100_000


def test_healthy_run_directory(healthy):
    _, run_dir = healthy
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["world_size"], meta["backend"], meta["script"]) == (2, "gloo", "reference")
    assert meta["total_steps"] == 12 and meta["torchrun"][2] == "torch.distributed.run"
    host_dirs = [p for p in (run_dir / "logs").iterdir() if p.is_dir()]
    assert len(host_dirs) == 1
    rank_logs = sorted(host_dirs[0].glob("*/attempt_0/*/stdout.log"))
    assert len(rank_logs) == 2 and "step 12/12" in rank_logs[0].read_text()
    agent_log = (host_dirs[0] / "torchrun.log").read_text()
    assert "[default" not in agent_log  # torchrun's own lines only: the ranks have their files


def test_healthy_run_directory_is_private(healthy):
    """Every folder 0700 and every file 0600, torchrun's rank logs and the checkpoint included."""
    _, run_dir = healthy
    assert (run_dir / "checkpoint" / "reference-model.pt").is_file()
    opened = [
        f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p.relative_to(run_dir)}"
        for p in (run_dir, *run_dir.rglob("*"))
        if stat.S_IMODE(p.lstat().st_mode) & 0o077
    ]
    assert not opened


def test_healthy_run_leaves_no_process(healthy):
    _, run_dir = healthy
    assert job_processes(run_dir) == []


# -- hang ------------------------------------------------------------------------------------


@pytest.fixture
def hang(shared_runs) -> tuple[Result, Path]:
    return shared(shared_runs, "hang")  # --steps 8 --inject hang:rank=1,step=4


def test_hang_is_diagnosed_and_the_job_stopped(hang):
    result, run_dir = hang
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ddpdoctor stopped the job after diagnosing a hang" in result.stdout
    assert "verdict: hang (exit code 1)" in result.stdout
    diag = diagnosis(run_dir)
    assert diag["verdict"] == "hang" and diag["culprits"] == [1]
    assert job_processes(run_dir) == []


def test_hang_trail(hang):
    _, run_dir = hang
    rank1 = events(run_dir, 1)
    faults = of_kind(rank1, "fault")
    assert [(f["fault"], f["step"], f["inject"]) for f in faults] == [
        ("hang", 4, "hang:rank=1,step=4")
    ]
    after = rank1[rank1.index(faults[0]) + 1 :]
    assert not of_kind(after, "collective_start")  # rank 1 never reached its next collective
    assert of_kind(after, "heartbeat")  # but it was alive
    # rank 0 waits in DDP's gradient all-reduce (C++, no event): the flight recorders say so
    recorders = diagnosis(run_dir)["flight_recorder"]
    (waiting,) = recorders["0"]["pending"]
    assert waiting["op"] == "all_reduce"
    assert recorders["1"]["pending"] == []
    assert recorders["1"]["groups"][0]["last_scheduled"] == waiting["seq"] - 1


# -- crash (after slow steps) and exit ------------------------------------------------------------


@pytest.fixture
def crash(shared_runs) -> tuple[Result, Path]:
    # --steps 16 --inject slow:rank=1,step=2,seconds=0.5 --inject crash:rank=1,step=12
    return shared(shared_runs, "crash")


@pytest.fixture
def exit_(shared_runs) -> tuple[Result, Path]:
    return shared(shared_runs, "exit")  # --steps 8 --inject exit:rank=1,step=4


@pytest.mark.parametrize(("name", "code"), [("exit", 17), ("crash", 1)])
def test_crash_and_exit_are_reported_with_their_codes(shared_runs, name, code):
    result, run_dir = shared(shared_runs, name)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"rank 1 exited with code {code}" in result.stdout
    assert diagnosis(run_dir)["verdict"] == "crash"
    assert job_processes(run_dir) == []


def test_crash_trail_is_a_fault_then_an_error(crash):
    _, run_dir = crash
    rank1 = events(run_dir, 1)
    fault = next(f for f in of_kind(rank1, "fault") if f["fault"] != "slow")
    assert (fault["fault"], fault["step"]) == ("crash", 12)
    error = of_kind(rank1, "error")[0]
    assert rank1.index(fault) < rank1.index(error)
    assert "InjectedCrash" in error["exc_type"] and "injected crash on rank 1" in error["message"]
    assert of_kind(rank1, "exit")[-1]["code"] == 1


def test_exit_trail_is_a_fault_and_no_exit_event(exit_):
    _, run_dir = exit_
    rank1 = events(run_dir, 1)
    assert [(f["fault"], f["step"]) for f in of_kind(rank1, "fault")] == [("exit", 4)]
    assert of_kind(rank1, "exit") == []  # os._exit: nothing recorded the death


def test_slow_trail_is_compute_time_on_the_slow_rank(crash):
    _, run_dir = crash
    faults = [(f["fault"], f["step"]) for f in of_kind(events(run_dir, 1), "fault")]
    assert faults == [("slow", 2), ("crash", 12)]
    slow = {s["step"]: s for s in of_kind(events(run_dir, 1), "step")}
    # The sleep is inside every step of the slow rank from step 2 on, as its own work (the peer's
    # share of the same wall time is waiting for it: how the runtime splits that is its own
    # test's job). The all-reduce wait comes from DDP's timers, sampled rather than read each
    # step: on a busy machine one step's split can carry a wait sampled in another, so the split
    # is read as the median of the slow steps.
    trail = [slow[step] for step in sorted(slow) if step >= 2]
    assert len(trail) >= 2 and all(s["step_time_s"] >= 0.19 for s in trail)
    trail = [s for s in trail if s["compute_time_s"] is not None]  # DDP's timers read (0.25 s on)
    assert len(trail) >= 2
    assert statistics.median(s["compute_time_s"] for s in trail) >= 0.19
    assert all(s["step_time_s"] >= s["compute_time_s"] for s in trail)


# -- collective mismatches ---------------------------------------------------------------------


@pytest.fixture
def mismatch(shared_runs) -> tuple[Result, Path]:
    return shared(shared_runs, "mismatch")  # --steps 8 --inject mismatch:rank=1,step=4


def test_mismatch_trail_is_a_barrier_facing_an_all_reduce(mismatch):
    result, run_dir = mismatch
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    rank1 = events(run_dir, 1)
    fault = of_kind(rank1, "fault")[0]
    assert (fault["fault"], fault["step"]) == ("mismatch", 4)
    barrier = of_kind(rank1[rank1.index(fault) :], "collective_start")[0]
    assert barrier["op"] == "barrier"
    # what rank 0 called at the same number is DDP's gradient all-reduce (C++, no event): the
    # backends' records put the two side by side
    diag = diagnosis(run_dir)
    assert diag["verdict"] == "mismatch"
    recorders = diag["flight_recorder"]
    (facing,) = recorders["0"]["pending"]
    (mine,) = recorders["1"]["pending"]
    assert (facing["op"], mine["op"]) == ("all_reduce", "barrier")
    assert facing["seq"] == mine["seq"]
    assert job_processes(run_dir) == []


@pytest.fixture
def shape(shared_runs) -> tuple[Result, Path]:
    return shared(shared_runs, "shape")  # --json --steps 8 --inject shape:rank=1,step=4


def test_json_output_is_the_final_diagnosis_alone_on_stdout(shape):
    result, run_dir = shape
    document = json.loads(result.stdout)  # nothing else on stdout
    assert document["verdict"] == "mismatch" == diagnosis(run_dir)["verdict"]
    assert document["job"]["exit_code"] == 1 and document["job"]["started"] is True
    assert "[default0]:" in result.stderr and "verdict: mismatch (exit code 1)" in result.stderr


def test_shape_trail_is_one_all_reduce_with_two_sizes(shape):
    result, run_dir = shape
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    rank1 = events(run_dir, 1)
    fault = of_kind(rank1, "fault")[0]
    assert (fault["fault"], fault["step"]) == ("shape", 4)
    garbled = of_kind(rank1[rank1.index(fault) :], "collective_start")[0]
    assert garbled["op"] == "all_reduce" and garbled["shapes"] == [[5]]
    peer = [  # the same call of the same group (DDP's gradient syncs count in a group of their own)
        e
        for e in of_kind(events(run_dir, 0), "collective_start")
        if (e["seq"], e.get("group")) == (garbled["seq"], garbled.get("group"))
    ]
    assert [(e["op"], e["shapes"]) for e in peer] == [("all_reduce", [[4]])]
    assert diagnosis(run_dir)["verdict"] == "mismatch"
    assert job_processes(run_dir) == []


# -- on real GPUs (skipped where NVML finds none) ------------------------------------------------


@pytest.mark.gpu
def test_reference_job_on_gpus_with_nccl(tmp_path, cache_dir):
    import pynvml

    pynvml.nvmlInit()
    try:
        nproc = min(2, pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--nproc", str(nproc), "--backend", "nccl", "--no-doctor",
        "--run-dir", str(run_dir), "--steps", "20",
    )  # fmt: skip
    result = run(cmd, timeout=600, env=clean_env({"DDPDOCTOR_CACHE_DIR": str(cache_dir)}))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "nccl on cuda, resnet18" in result.stdout
    assert f"parameters identical on all {nproc} ranks" in result.stdout
    assert json.loads((run_dir / "run.json").read_text())["backend"] == "nccl"
    for rank in range(nproc):
        hello = of_kind(events(run_dir, rank), "hello")[-1]
        assert hello["device"] == f"cuda:{rank}" and hello["backend"] == "nccl"
    assert list((run_dir / "nccl").glob("*.log"))  # NCCL_DEBUG=INFO went to NCCL_DEBUG_FILE
    assert job_processes(run_dir) == []
