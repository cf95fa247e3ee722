"""torch.distributed's variables from an MPI launcher's, for jobs started by mpirun / mpiexec.

Each MPI implementation describes a rank with its own variables:

    launcher                       rank                  size                  local rank / size
    Open MPI (mpirun, prterun)     OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_SIZE  OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE
    MPICH Hydra, Intel MPI         PMI_RANK              PMI_SIZE              MPI_LOCALRANKID / MPI_LOCALNRANKS
    MVAPICH2                       MV2_COMM_WORLD_RANK   MV2_COMM_WORLD_SIZE   MV2_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE
    PMIx launchers                 PMIX_RANK             (WORLD_SIZE needed)   -

No MPI launcher says which host runs rank 0, so MASTER_ADDR must come from the user
(`mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...`) unless every rank runs on this
host (local size == world size), where 127.0.0.1 is right. MASTER_PORT defaults to 29500.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class _Flavor:
    name: str
    rank: str
    size: str | None
    local_rank: str | None
    local_size: str | None


FLAVORS = (
    _Flavor(
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    _Flavor("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    _Flavor(
        "MVAPICH2",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    _Flavor("PMIx", "PMIX_RANK", None, None, None),
)


class MpiEnvError(ValueError):
    """An MPI environment that cannot be translated; the message names the variable and the fix."""


def detect_flavor(env: Mapping[str, str]) -> str | None:
    """The MPI implementation that started this process, or None outside MPI."""
    flavor = _flavor(env)
    return flavor.name if flavor else None


def torch_env_from_mpi(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for this MPI
    rank. Raises MpiEnvError naming what is missing or wrong."""
    flavor = _flavor(env)
    if flavor is None:
        names = ", ".join(f.rank for f in FLAVORS)
        raise MpiEnvError(f"not started by an MPI launcher: none of {names} is set")
    rank = _int(env, flavor.rank)
    size_var = flavor.size if flavor.size and flavor.size in env else "WORLD_SIZE"
    if size_var not in env:
        raise MpiEnvError(
            f"{flavor.name} sets {flavor.rank} but not the world size: export WORLD_SIZE "
            "(mpirun -x WORLD_SIZE=<ranks>)"
        )
    world = _int(env, size_var)
    if not 0 <= rank < world:
        raise MpiEnvError(f"{flavor.rank}={rank} is not below {size_var}={world}")
    result = {"RANK": str(rank), "WORLD_SIZE": str(world)}
    local_rank = _optional_int(env, flavor.local_rank)
    local_size = _optional_int(env, flavor.local_size)
    if local_rank is not None:
        result["LOCAL_RANK"] = str(local_rank)
    if local_size is not None:
        result["LOCAL_WORLD_SIZE"] = str(local_size)
    result["MASTER_ADDR"] = env.get("MASTER_ADDR") or _single_host_master(flavor, local_size, world)
    result["MASTER_PORT"] = env.get("MASTER_PORT") or str(DEFAULT_PORT)
    return result


def _single_host_master(flavor: _Flavor, local_size: int | None, world: int) -> str:
    if local_size == world:
        return "127.0.0.1"  # every rank is on this host
    raise MpiEnvError(
        f"{flavor.name} does not say which host runs rank 0 and MASTER_ADDR is unset: pass it "
        "to every rank (mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...)"
    )


def _flavor(env: Mapping[str, str]) -> _Flavor | None:
    return next((f for f in FLAVORS if f.rank in env), None)


def _optional_int(env: Mapping[str, str], name: str | None) -> int | None:
    return _int(env, name) if name is not None and name in env else None


def _int(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise MpiEnvError(f"{name}={text!r} is not an integer") from None
    if value < 0:
        raise MpiEnvError(f"{name}={text!r} is negative")
    return value
