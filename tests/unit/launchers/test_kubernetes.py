"""A Kubernetes pod's launch: torchrun's PET_* variables as Kubeflow's PyTorchJob and Trainer
set them, read by the doctor as the launch configuration."""

from __future__ import annotations

import pytest

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.launcher import launcher_detect
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.plan import build_plan
from ddpdoctor.errors import UsageError
from ddpdoctor.launchers.identity import detect_launch
from ddpdoctor.launchers.kubernetes import pet_config, torch_env_from_pet
from tests.unit.recorded_machines import context

# What Kubeflow Trainer puts in the pod of node 1 of a 2-node job (trainer.kubeflow.org)
POD = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "pytorch-job-node-0-0.pytorch-job",
    "PET_MASTER_PORT": "29400",
}


def test_pet_variables_are_the_launch_configuration():
    config = pet_config(POD)
    assert config is not None
    assert (config.nnodes, config.nproc_per_node, config.node_rank) == (2, 4, 1)
    assert (config.master_addr, config.master_port) == ("pytorch-job-node-0-0.pytorch-job", 29400)
    assert pet_config({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None


def test_an_elastic_range_and_a_rendezvous_endpoint_are_read_as_torchrun_reads_them():
    config = pet_config({"PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": "job-master:29400"})
    assert config is not None
    assert (config.nnodes, config.master_addr, config.master_port) == (4, "job-master", 29400)
    auto = pet_config({"PET_NPROC_PER_NODE": "auto"})
    assert auto is not None and auto.nproc_per_node is None


def test_the_doctor_names_the_pod_and_its_launch():
    result = launcher_detect(context(env=POD))
    assert result.status is Status.PASS, result.summary
    assert result.summary == (
        "started by torchrun's PET_* variables (torchrun not started yet) in a Kubernetes pod: "
        "2 nodes x 4 processes, node rank 1, master pytorch-job-node-0-0.pytorch-job:29400"
    )
    assert result.facts["kubernetes"] is True and result.facts["pet"]["node_rank"] == 1
    assert "PET_NNODES=2" in result.details


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"PET_NNODES": "2", "PET_NODE_RANK": "0"}, "neither PET_MASTER_ADDR"),
        ({**POD, "PET_NODE_RANK": "2"}, "PET_NODE_RANK=2 is not below PET_NNODES=2"),
    ],
)
def test_pet_settings_torchrun_cannot_use_are_flagged(env, words):
    result = launcher_detect(context(env=env))
    assert result.status in (Status.WARN, Status.FAIL) and words in result.summary
    assert result.fix


def test_the_plan_reads_nodes_ranks_and_master_from_pet():
    plan = build_plan(POD)
    assert (plan.nnodes, plan.nproc_per_node, plan.multi_node) == (2, 4, True)
    assert (plan.master_addr, plan.master_port) == ("pytorch-job-node-0-0.pytorch-job", 29400)
    assert not plan.is_master_host()  # node rank 1
    assert build_plan({**POD, "PET_NODE_RANK": "0"}).is_master_host()
    # torchrun's own variables, once it runs, win over PET_*
    started = build_plan(
        {**POD, "MASTER_ADDR": "10.0.0.5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    )
    assert started.master_addr == "10.0.0.5"


def test_distributed_doctor_in_an_init_container_is_one_rank_per_pod():
    info = detect_launch(POD)
    assert (info.launcher, info.rank, info.world_size, info.node_rank) == ("pet", 1, 2, 1)
    assert (info.master_addr, info.master_port) == ("pytorch-job-node-0-0.pytorch-job", 29400)
    assert torch_env_from_pet({"PET_NNODES": "2"}) is None  # no node rank: not enough
    with pytest.raises(UsageError, match="PET_NODE_RANK is not set but PET_NNODES=2"):
        detect_launch({"PET_NNODES": "2"})


# The pod of node 1, as the distributed doctor reads it, with one value broken at a time: the
# one line names the PET_* variable the user set (never RANK or MASTER_PORT, never "unset" for
# a variable that is set).
BAD_PET = [
    ({"PET_MASTER_PORT": "abc"}, "PET_MASTER_PORT='abc' is not a TCP port"),
    ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000' is not a TCP port"),
    ({"PET_NODE_RANK": "x"}, "PET_NODE_RANK='x' is not an integer"),
    ({"PET_NODE_RANK": "2"}, "PET_NODE_RANK=2 is not below PET_NNODES=2"),
    ({"PET_NODE_RANK": "-1"}, "PET_NODE_RANK=-1 is not below PET_NNODES=2"),
    ({"PET_NNODES": "two"}, "PET_NNODES='two' is not a number of nodes"),
    ({"PET_NNODES": "0"}, "PET_NNODES='0' names no usable number of nodes"),
    ({"PET_NNODES": "4:2"}, "PET_NNODES='4:2' names no usable number of nodes"),
    ({"PET_NNODES": None}, "PET_NODE_RANK=1 is not below PET_NNODES unset (torchrun's 1 node)"),
    ({"PET_MASTER_ADDR": None}, "neither PET_MASTER_ADDR nor PET_RDZV_ENDPOINT is set"),
    ({"PET_MASTER_ADDR": " "}, "PET_MASTER_ADDR is set but empty"),
    (
        {"PET_MASTER_ADDR": None, "PET_MASTER_PORT": None, "PET_RDZV_ENDPOINT": "job-0:abc"},
        "PET_RDZV_ENDPOINT='job-0:abc': its port is not a TCP port",
    ),
    (
        {"PET_MASTER_ADDR": None, "PET_RDZV_ENDPOINT": ":29400"},
        "PET_RDZV_ENDPOINT=':29400' names no host",
    ),
]


@pytest.mark.parametrize(("change", "words"), BAD_PET)
def test_bad_pet_values_are_named_by_the_variable_the_user_set(change, words):
    env = {**POD, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(UsageError) as caught:
        detect_launch(env)
    message = str(caught.value)
    assert words in message, message
    assert "RANK=" not in message.replace("NODE_RANK=", "") and "MASTER_PORT " not in message


def test_pet_values_torchrun_defaults_and_endpoints_are_read_as_torchrun_reads_them():
    one = detect_launch({"PET_NNODES": "1", "PET_NODE_RANK": "0"})  # torchrun's 127.0.0.1:29500
    assert (one.world_size, one.master_addr, one.master_port) == (1, "127.0.0.1", 29500)
    no_port = detect_launch({k: v for k, v in POD.items() if k != "PET_MASTER_PORT"})
    assert no_port.master_port == 29500 and no_port.port_var == "PET_MASTER_PORT"
    endpoint = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_RDZV_ENDPOINT": "[fd00::5]:29401"}
    info = detect_launch(endpoint)
    assert (info.master_addr, info.master_port, info.addr_var) == (
        "fd00::5",
        29401,
        "PET_RDZV_ENDPOINT",
    )
    c10d = detect_launch({**endpoint, "PET_RDZV_ENDPOINT": "job-0", "PET_RDZV_BACKEND": "c10d"})
    assert (c10d.master_addr, c10d.master_port) == ("job-0", 29400)
    elastic = detect_launch({**POD, "PET_NNODES": "1:2"})
    assert elastic.world_size == 2
    flagged = detect_launch(POD, master_addr="10.0.0.5", master_port=29501)
    assert (flagged.addr_var, flagged.port_var) == ("--master-addr", "--master-port")
    assert (detect_launch(POD).addr_var, detect_launch(POD).port_var) == (
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    )


def test_the_master_address_is_named_by_its_pet_variable():
    from ddpdoctor.checks import net_facts

    ctx = context(env=POD, options=DoctorOptions(smoke=False))
    assert net_facts.addr_label(ctx) == "PET_MASTER_ADDR"
    assert net_facts.port_label(ctx) == "PET_MASTER_PORT"
