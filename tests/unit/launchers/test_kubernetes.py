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
    with pytest.raises(UsageError, match="PET_NNODES/PET_NODE_RANK"):
        detect_launch({"PET_NNODES": "2"})


def test_the_master_address_is_named_by_its_pet_variable():
    from ddpdoctor.checks import net_facts

    ctx = context(env=POD, options=DoctorOptions(smoke=False))
    assert net_facts.addr_label(ctx) == "PET_MASTER_ADDR"
    assert net_facts.port_label(ctx) == "PET_MASTER_PORT"
