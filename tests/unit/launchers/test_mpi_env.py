"""MPI launchers' variables -> torch's, and which launcher's view the distributed doctor takes."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.launchers.identity import detect_launch
from ddpdoctor.launchers.mpi import MpiEnvError, detect_flavor, torch_env_from_mpi

# `mpirun -np 8 --map-by ppr:4:node -x MASTER_ADDR=gpu07 env` (Open MPI 4.1), rank 6, abridged.
OPENMPI_RANK_6 = {
    "OMPI_COMM_WORLD_RANK": "6",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "2",
    "OMPI_UNIVERSE_SIZE": "8",
    "OMPI_MCA_orte_hnp_uri": "1290338304.0;tcp://10.0.0.7:38241",
    "PMIX_RANK": "6",
    "PMIX_NAMESPACE": "1290338305",
    "MASTER_ADDR": "gpu07",
}
# `mpiexec -n 4 -ppn 2 env` (MPICH 4 Hydra / Intel MPI), rank 3.
HYDRA_RANK_3 = {
    "PMI_RANK": "3",
    "PMI_SIZE": "4",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
    "PMI_FD": "6",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29600",
}
MVAPICH_RANK_1 = {
    "MV2_COMM_WORLD_RANK": "1",
    "MV2_COMM_WORLD_SIZE": "2",
    "MV2_COMM_WORLD_LOCAL_RANK": "1",
    "MV2_COMM_WORLD_LOCAL_SIZE": "2",
}


def test_open_mpi():
    assert detect_flavor(OPENMPI_RANK_6) == "Open MPI"
    assert torch_env_from_mpi(OPENMPI_RANK_6) == {
        "RANK": "6",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": "29500",
    }


def test_mpich_hydra_and_intel_mpi():
    assert detect_flavor(HYDRA_RANK_3) == "MPICH/Intel MPI"
    assert torch_env_from_mpi(HYDRA_RANK_3) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29600",
    }


def test_all_ranks_on_this_host_need_no_master_addr():
    derived = torch_env_from_mpi(MVAPICH_RANK_1)
    assert derived["MASTER_ADDR"] == "127.0.0.1"
    assert (derived["RANK"], derived["LOCAL_WORLD_SIZE"]) == ("1", "2")


def test_pmix_alone_needs_the_world_size():
    with pytest.raises(MpiEnvError, match="export WORLD_SIZE"):
        torch_env_from_mpi({"PMIX_RANK": "0", "MASTER_ADDR": "h"})
    derived = torch_env_from_mpi({"PMIX_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    assert (derived["RANK"], derived["WORLD_SIZE"]) == ("1", "2")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({k: v for k, v in OPENMPI_RANK_6.items() if k != "MASTER_ADDR"}, "-x MASTER_ADDR"),
        ({**OPENMPI_RANK_6, "OMPI_COMM_WORLD_RANK": "8"}, "not below OMPI_COMM_WORLD_SIZE=8"),
        ({**HYDRA_RANK_3, "PMI_RANK": "three"}, "'three' is not an integer"),
        ({**HYDRA_RANK_3, "PMI_SIZE": "-4"}, "negative"),
        ({}, "not started by an MPI launcher"),
    ],
)
def test_broken_mpi_environments_are_named(env, message):
    with pytest.raises(MpiEnvError, match=message):
        torch_env_from_mpi(env)


def test_detect_launch_under_mpirun():
    info = detect_launch(OPENMPI_RANK_6)
    assert info.launcher == "mpi"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (6, 8, 2, 4)
    assert info.node_rank is None  # Open MPI does not number nodes; nodes are told by host
    assert (info.master_addr, info.master_port, info.agent_store) == ("gpu07", 29500, False)


def test_mpi_without_master_is_a_usage_error():
    env = {k: v for k, v in OPENMPI_RANK_6.items() if k != "MASTER_ADDR"}
    with pytest.raises(UsageError, match=r"Open MPI environment: .*MASTER_ADDR"):
        detect_launch(env)


def test_plain_environment_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.local_rank, info.node_rank) == ("env", 1, 0, None)
    assert not info.agent_store


def test_torchrun_wins_over_mpi_and_reads_group_rank():
    env = {
        **HYDRA_RANK_3,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "41000",
        "TORCHELASTIC_RUN_ID": "abc",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    info = detect_launch(env)
    assert (info.launcher, info.node_rank, info.run_id, info.agent_store) == (
        "torchrun",
        1,
        "abc.1",
        True,
    )


def test_command_line_master_overrides_the_environment_and_the_agent_store():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "a",
        "MASTER_PORT": "1",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    info = detect_launch(env, master_addr="b", master_port=2345)
    assert (info.master_addr, info.master_port, info.agent_store) == ("b", 2345, False)
    tcp = detect_launch({"RANK": "0", "WORLD_SIZE": "1"}, init_method="tcp://10.0.0.1:23456")
    assert (tcp.master_addr, tcp.master_port) == ("10.0.0.1", 23456)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "needs a launcher"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"},
            "'99999' is not a port",
        ),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "below WORLD_SIZE=2",
        ),
        (
            {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "RANK='x' is not an integer",
        ),
    ],
)
def test_launch_problems_are_usage_errors(env, message):
    with pytest.raises(UsageError, match=message):
        detect_launch(env)
