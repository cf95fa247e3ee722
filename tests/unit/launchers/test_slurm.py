"""Slurm host lists and the SLURM_* -> torch variables translation, on recorded environments."""

from __future__ import annotations

import re

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.launchers.hostlist import (
    HostlistError,
    expand_hostlist,
    expand_tasks_per_node,
    first_host,
)
from ddpdoctor.launchers.identity import detect_launch
from ddpdoctor.launchers.slurm import (
    SlurmEnvError,
    derived_port,
    in_slurm_step,
    task_hosts,
    torch_env_from_slurm,
)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("node-[1-3],login1", ["node-1", "node-2", "node-3", "login1"]),
        ("dgx[001-002,010]", ["dgx001", "dgx002", "dgx010"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("n[8-10]", ["n8", "n9", "n10"]),  # the width of the low end sets the padding
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("c457-[011-012],c439-021", ["c457-011", "c457-012", "c439-021"]),  # TACC style
        ("rack[0-1]_blade[1-2]", ["rack0_blade1", "rack0_blade2", "rack1_blade1", "rack1_blade2"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("n[001-003]-ib", ["n001-ib", "n002-ib", "n003-ib"]),  # pdsh-style suffix
        ("gpu[1,3],gpu[5-6]", ["gpu1", "gpu3", "gpu5", "gpu6"]),
        ("  host1 host2\thost3 ", ["host1", "host2", "host3"]),
        ("localhost", ["localhost"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
        ("", []),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("gpu[01-", "never closed"),
        ("gpu]1", "without '['"),
        ("gpu[[1]]", "cannot nest"),
        ("gpu[a-b]", "not a number"),
        ("gpu[3-1]", "backwards"),
        ("gpu[]", "empty brackets"),
        ("gpu[1,,2]", "not a number"),
        ("gpu[0-99999]", "more than"),
        ("a[0-999]b[0-999]", "more than"),
    ],
)
def test_bad_hostlists_raise_with_the_text(text, problem):
    with pytest.raises(HostlistError, match=re.escape(problem)) as err:
        expand_hostlist(text)
    assert text in str(err.value)


def test_first_host_does_not_expand_the_rest():
    assert first_host("gpu[07-08],login[1-60000]") == "gpu07"
    assert first_host("") is None


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2(x3),1", [2, 2, 2, 1]), ("8", [8]), ("4(x2)", [4, 4]), ("1,2,3", [1, 2, 3])],
)
def test_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["2(3)", "x", "2(x)", ""])
def test_bad_tasks_per_node(text):
    with pytest.raises(HostlistError):
        expand_tasks_per_node(text)


# `srun -N2 --ntasks-per-node=4 env` on a two-node allocation, task 5 (second node, local 1);
# abridged to the SLURM_* variables that matter, values as Slurm 23.11 prints them.
SRUN_TASK_5 = {
    "SLURM_JOB_ID": "4818312",
    "SLURM_JOBID": "4818312",
    "SLURM_JOB_NAME": "ddp",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "8",
    "SLURM_NPROCS": "8",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "gpu08",
    "SLURM_GPUS_ON_NODE": "4",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}


def test_recorded_srun_task():
    assert torch_env_from_slurm(SRUN_TASK_5) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": "23312",  # 15000 + 8312
    }


def test_step_counts_win_over_job_counts():
    # The batch allocation has 16 tasks but this step runs 8: init would wait forever for 16.
    env = {**SRUN_TASK_5, "SLURM_NTASKS": "16", "SLURM_JOB_NODELIST": "gpu[05-08]"}
    derived = torch_env_from_slurm(env)
    assert derived["WORLD_SIZE"] == "8"
    assert derived["MASTER_ADDR"] == "gpu07"  # the step's first node, where task 0 runs


def test_uneven_tasks_per_node_read_for_this_node():
    env = {
        **SRUN_TASK_5,
        "SLURM_STEP_TASKS_PER_NODE": "3(x2),2",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_NODEID": "2",
        "SLURM_PROCID": "7",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-09]",
    }
    assert torch_env_from_slurm(env)["LOCAL_WORLD_SIZE"] == "2"


def test_user_master_addr_and_port_win():
    env = {**SRUN_TASK_5, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29511"}
    derived = torch_env_from_slurm(env)
    assert (derived["MASTER_ADDR"], derived["MASTER_PORT"]) == ("10.1.2.3", "29511")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_PROCID": None}, "SLURM_PROCID is not set"),
        ({"SLURM_PROCID": "8"}, "not below the task count 8"),
        ({"SLURM_PROCID": "x"}, "'x' is not an integer"),
        ({"SLURM_LOCALID": "4"}, "not below this node's task count 4"),
        ({"SLURM_STEP_NUM_TASKS": None, "SLURM_NTASKS": None, "SLURM_NPROCS": None}, "not set"),
        ({"SLURM_STEP_NODELIST": "gpu[07-", "SLURM_JOB_NODELIST": None}, "never closed"),
        (
            {"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None, "SLURM_NODELIST": None},
            "cannot tell the master host",
        ),
        ({"SLURM_STEP_TASKS_PER_NODE": "4,4", "SLURM_NODEID": "5"}, "beyond"),
    ],
)
def test_broken_slurm_environments_are_named(change, message):
    env = dict(SRUN_TASK_5)
    for key, value in change.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    with pytest.raises(SlurmEnvError, match=message):
        torch_env_from_slurm(env)


def test_derived_port():
    assert derived_port("4818312") == 23312
    assert derived_port("77") == 15077
    assert derived_port("123_4") == 16234  # array job ids carry an underscore
    assert derived_port(None) == 29500


def test_batch_script_is_not_an_srun_step():
    batch = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2"}
    assert not in_slurm_step(batch)
    assert in_slurm_step(SRUN_TASK_5)


def test_task_hosts_block_distribution():
    assert task_hosts(SRUN_TASK_5) == ["gpu07"] * 4 + ["gpu08"] * 4
    assert task_hosts(
        {"SLURM_STEP_NODELIST": "a[1-3]", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}
    ) == [
        "a1",
        "a1",
        "a2",
        "a2",
        "a3",
    ]
    assert task_hosts({"SLURM_STEP_NODELIST": "a[1-3]", "SLURM_STEP_TASKS_PER_NODE": "2,2"}) is None


def test_detect_launch_under_srun_alone():
    info = detect_launch(SRUN_TASK_5)
    assert info.launcher == "slurm"
    assert (info.rank, info.world_size, info.local_rank, info.node_rank) == (5, 8, 1, 1)
    assert (info.master_addr, info.master_port) == ("gpu07", 23312)
    assert info.run_id == "4818312.0"
    assert info.torch_env["LOCAL_WORLD_SIZE"] == "4"


def test_torchrun_inside_srun_reads_torchrun():
    # `srun --ntasks-per-node=1 torchrun ...`: the worker sees torchrun's variables as well.
    env = {
        **SRUN_TASK_5,
        "RANK": "2",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.node_rank, info.master_port) == ("torchrun", 2, 0, 29400)
    assert info.agent_store


def test_bad_slurm_environment_is_a_usage_error():
    env = {**SRUN_TASK_5, "SLURM_PROCID": "9"}
    with pytest.raises(UsageError, match="Slurm environment: SLURM_PROCID=9"):
        detect_launch(env)
