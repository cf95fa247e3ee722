"""launcher.detect, launcher.env and launcher.slurm with injected environments (F01-F07)."""

from __future__ import annotations

import pytest

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.launcher import launcher_detect, launcher_env, launcher_slurm
from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.launchers.detect import detect_launcher, first_count
from tests.unit.recorded_machines import context

MASTER = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job42",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    **MASTER,
}


def run(check, ctx) -> CheckResult:
    result = check(ctx)
    assert result.status is not Status.ERROR, (result.summary, result.details)
    if result.status in (Status.WARN, Status.FAIL):
        assert result.fix, "every warning and failure carries a fix"
    return result


def test_plain_python_is_not_a_failure():
    ctx = context(env={})
    detect = run(launcher_detect, ctx)
    assert detect.status is Status.PASS and "plain python" in detect.summary
    env = run(launcher_env, ctx)
    assert env.status is Status.SKIP
    assert "not inside a launcher; torchrun will set" in env.summary
    assert run(launcher_slurm, ctx).status is Status.SKIP


def test_a_healthy_torchrun_worker():
    ctx = context(env=TORCHRUN)
    detect = run(launcher_detect, ctx)
    assert detect.summary == "started by torchrun"
    assert detect.facts["variables"]["TORCHELASTIC_RUN_ID"] == "job42"
    env = run(launcher_env, ctx)
    assert env.status is Status.PASS
    assert env.summary == "rank 3 of 4, local rank 1 of 2, master node0:29500"
    assert env.facts["rank"] == 3 and env.facts["world_size"] == 4


BAD_ENVIRONMENTS = [
    # (env, words the failure must name)
    ({"WORLD_SIZE": "abc", "RANK": "0", **MASTER}, ["WORLD_SIZE='abc' is not an integer"]),
    ({"RANK": "-1", "WORLD_SIZE": "2", **MASTER}, ["RANK=-1 is negative"]),
    ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, ["RANK=2 is not below WORLD_SIZE=2"]),
    ({"RANK": "0", "WORLD_SIZE": "0", **MASTER}, ["WORLD_SIZE=0 must be at least 1"]),
    ({"RANK": "x1", "WORLD_SIZE": "2", **MASTER}, ["RANK='x1' is not an integer"]),
    (
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "12139", "MASTER_PORT": "127.0.0.1"},
        ["look swapped"],
    ),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "abc"}, ["MASTER_PORT"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " ", "MASTER_PORT": "1"}, ["empty"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, ["MASTER_ADDR", "env://"]),
    ({"RANK": "0"}, ["WORLD_SIZE, MASTER_ADDR, MASTER_PORT"]),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, ["LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"]),
    ({**TORCHRUN, "LOCAL_RANK": "-3"}, ["LOCAL_RANK=-3 is negative"]),
    ({**TORCHRUN, "RANK": "2"}, ["GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK", "= 3"]),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "1"}, ["larger than WORLD_SIZE=4"]),
]


@pytest.mark.parametrize(("env", "words"), BAD_ENVIRONMENTS)
def test_bad_rank_environments_fail_by_name(env, words):
    result = run(launcher_env, context(env=env))
    assert result.status is Status.FAIL
    for word in words:
        assert word in result.summary


def test_swapped_master_values_get_the_exact_fix():
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "12139", "MASTER_PORT": "127.0.0.1"}
    result = run(launcher_env, context(env=env))
    assert result.fix == "export MASTER_ADDR=127.0.0.1 MASTER_PORT=12139"


def test_several_problems_are_all_listed():
    env = {"RANK": "-1", "WORLD_SIZE": "abc", "LOCAL_RANK": "zz"}
    result = run(launcher_env, context(env=env))
    assert result.status is Status.FAIL
    assert "more problems" in result.summary
    listed = " ".join(result.details)
    for word in ("WORLD_SIZE='abc'", "LOCAL_RANK='zz'", "MASTER_ADDR", "RANK=-1"):
        assert word in listed


def test_master_from_the_command_line_counts():
    env = {"RANK": "0", "WORLD_SIZE": "2"}
    options = DoctorOptions(master_addr="10.0.0.1", master_port=29501, smoke=False)
    result = run(launcher_env, context(env=env, options=options))
    assert result.status is Status.PASS
    assert "master 10.0.0.1:29501" in result.summary


def test_tcp_init_method_does_not_need_master_variables():
    options = DoctorOptions(init_method="tcp://10.0.0.1:23456", smoke=False)
    result = run(launcher_env, context(env={"RANK": "1", "WORLD_SIZE": "2"}, options=options))
    assert result.status is Status.PASS


def test_uneven_nodes_warn():
    env = {**TORCHRUN, "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "GROUP_RANK": "1"}
    result = run(launcher_env, context(env=env))
    assert result.status is Status.WARN
    assert "not a multiple of LOCAL_WORLD_SIZE=4" in result.summary


@pytest.mark.parametrize(
    ("machine", "extra", "status"),
    [
        ("workstation-2gpu-busy", {"LOCAL_RANK": "1"}, Status.PASS),
        ("workstation-2gpu-busy", {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}, Status.FAIL),
        ("workstation-2gpu-busy", {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1"}, Status.FAIL),
        ("cpu-only", {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, Status.PASS),  # gloo ranks
    ],
)
def test_local_rank_against_visible_gpus(machine, extra, status):
    env = {"RANK": extra["LOCAL_RANK"], "WORLD_SIZE": "4", **MASTER, **extra}
    result = run(launcher_env, context(machine, env))
    assert result.status is status, result.summary
    if status is Status.FAIL:
        assert "invalid device ordinal" in result.summary


def test_slurm_without_torch_variables_is_not_judged_by_launcher_env():
    env = {"SLURM_JOB_ID": "812", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}
    result = run(launcher_env, context(env=env))
    assert result.status is Status.SKIP and "Slurm" in result.summary


SRUN_STEP = {
    "SLURM_JOB_ID": "812",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4",
}


def test_srun_tasks_without_rank_variables_warn_with_the_mapping():
    result = run(launcher_slurm, context(env=SRUN_STEP))
    assert result.status is Status.WARN
    assert "KeyError 'RANK'" in result.summary
    assert "RANK=$SLURM_PROCID" in result.fix


def test_slurm_mapping_that_matches_passes():
    env = {**SRUN_STEP, "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", **MASTER}
    result = run(launcher_slurm, context(env=env))
    assert result.status is Status.PASS
    assert result.facts["step_tasks"] == 4 and result.facts["job_tasks"] == 8
    assert any("this srun step runs 4" in d for d in result.details)


def test_world_size_from_job_level_ntasks_fails():
    env = {**SRUN_STEP, "RANK": "2", "WORLD_SIZE": "8", "LOCAL_RANK": "2", **MASTER}
    result = run(launcher_slurm, context(env=env))
    assert result.status is Status.FAIL
    assert "job-level SLURM_NTASKS=8" in result.summary
    assert result.fix == "export WORLD_SIZE=$SLURM_STEP_NUM_TASKS"


def test_rank_not_matching_procid_fails():
    env = {**SRUN_STEP, "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "3", **MASTER}
    result = run(launcher_slurm, context(env=env))
    assert result.status is Status.FAIL
    assert "RANK=1 but SLURM_PROCID=2" in result.summary
    assert any("LOCAL_RANK=3 but SLURM_LOCALID=2" in d for d in result.details)


def test_srun_and_torchrun_both_spawning_fails():
    env = {**SRUN_STEP, **TORCHRUN}
    result = run(launcher_detect, context(env=env))
    assert result.status is Status.FAIL
    assert "F06" in result.summary and "4 x 2 processes per node" in result.summary
    assert "srun --ntasks-per-node=1 torchrun" in result.fix


def test_torchrun_in_a_batch_script_with_tasks_per_node_only_warns():
    env = {"SLURM_JOB_ID": "9", "SLURM_NTASKS_PER_NODE": "8", "SLURM_NNODES": "1", **TORCHRUN}
    result = run(launcher_detect, context(env=env))
    assert result.status is Status.WARN
    assert "torchrun inside Slurm batch job" in result.facts["launcher"]


def test_one_torchrun_per_node_under_srun():
    env = {**SRUN_STEP, "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NUM_NODES": "2", **TORCHRUN}
    ctx = context(env=env)
    assert run(launcher_detect, ctx).summary == "started by torchrun inside srun"
    assert run(launcher_slurm, ctx).status is Status.PASS
    wrong = context(env={**env, "SLURM_STEP_NUM_NODES": "3"})
    result = run(launcher_slurm, wrong)
    assert result.status is Status.FAIL and "--nnodes=3" in result.fix


def test_mpirun_and_torchrun_both_spawning_fails():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", **TORCHRUN}
    result = run(launcher_detect, context(env=env))
    assert result.status is Status.FAIL and "mpirun starts 4" in result.summary


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "plain python (no launcher)"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "set by hand"),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "mpirun (Open MPI)"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "mpirun (MPICH / Intel MPI (PMI))"),
        ({"PMIX_RANK": "0"}, "mpirun (PMIx)"),
        ({"SLURM_JOB_ID": "1"}, "Slurm batch job"),
        ({"SLURM_JOB_ID": "1", "SLURM_STEP_NUM_TASKS": "2"}, "srun"),
        ({"TORCHELASTIC_RUN_ID": "x"}, "torchrun"),
    ],
)
def test_launcher_names(env, name):
    assert detect_launcher(env).name == name


@pytest.mark.parametrize(
    ("text", "count"), [("8(x2),4", 8), ("4", 4), ("", None), (None, None), ("x", None)]
)
def test_slurm_task_lists(text, count):
    assert first_count(text) == count
