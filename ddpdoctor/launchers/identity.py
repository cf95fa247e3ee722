"""Who am I in the job? Rank, world size, node and master, from whichever launcher started us.

torchrun's variables win (they are also what a plain `RANK=... WORLD_SIZE=... python` sets), then
Slurm's (srun without torchrun), then MPI's (mpirun / mpiexec). `srun ... torchrun ...` therefore
reads torchrun's view, which is the one the training script will see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from ddpdoctor.errors import UsageError
from ddpdoctor.launchers.detect import detect_launcher
from ddpdoctor.launchers.kubernetes import (
    PetEnvError,
    pet_launch,
    pet_master_vars,
    wants_pet_launch,
)
from ddpdoctor.launchers.mpi import MpiEnvError, detect_flavor, torch_env_from_mpi
from ddpdoctor.launchers.slurm import SlurmEnvError, in_slurm_step, torch_env_from_slurm
from ddpdoctor.launchers.variables import TORCH_VARS, parse_int


@dataclass(frozen=True)
class LaunchInfo:
    # "torchrun", "env" (RANK/WORLD_SIZE set by hand), "slurm", "mpi", "ray" (a task per node of a
    # Ray cluster) or "pet" (torchrun's PET_* variables in a pod, before torchrun starts:
    # ddpdoctor.launchers.kubernetes)
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node_rank: int | None  # GROUP_RANK / SLURM_NODEID; None when the launcher does not say
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's agent already serves a TCPStore at MASTER_ADDR:MASTER_PORT
    run_id: str  # namespaces our keys in a store that may outlive one doctor run
    torch_env: Mapping[str, str] = field(default_factory=dict)  # RANK... as the job sees them
    # where the master's address and port came from, to name them in messages (PET_MASTER_ADDR
    # in a pod, --master-addr when given on the command line)
    addr_var: str = "MASTER_ADDR"
    port_var: str = "MASTER_PORT"

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def detect_launch(
    env: Mapping[str, str],
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    init_method: str | None = None,
) -> LaunchInfo:
    """Raises UsageError with a fix when no launcher (or a broken one) describes this process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if detect_launcher(env).torchrun else "env"
        if launcher == "env" and env.get("DDPDOCTOR_LAUNCHED_BY") == "ray":
            launcher = "ray"  # `doctor --distributed --ray` set them, one task per Ray node
        torch_env = {k: env[k] for k in TORCH_VARS if k in env}
    elif in_slurm_step(env):
        launcher = "slurm"
        torch_env = _translated(torch_env_from_slurm, env, "Slurm")
    elif detect_flavor(env):
        launcher = "mpi"
        torch_env = _translated(torch_env_from_mpi, env, detect_flavor(env) or "MPI")
    elif wants_pet_launch(env):
        launcher = "pet"  # a pod's torchrun variables, before torchrun: one rank per pod
        try:
            torch_env = pet_launch(env)
        except PetEnvError as exc:
            raise UsageError(f"the pod's torchrun variables: {exc}") from None
    else:
        raise UsageError(
            "--distributed needs a launcher: start it with torchrun, srun or mpirun on every node "
            "(none of RANK/WORLD_SIZE, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or "
            "PET_NNODES/PET_NODE_RANK is set)"
        )

    tcp_host, tcp_port = _tcp_endpoint(init_method)
    addr = master_addr or tcp_host or torch_env.get("MASTER_ADDR")
    port_text = (
        str(master_port) if master_port is not None else tcp_port or torch_env.get("MASTER_PORT")
    )
    addr_var, port_var = _master_vars(launcher, env, master_addr, master_port, tcp_host, tcp_port)
    if not addr:
        raise UsageError(
            "MASTER_ADDR is not set: export MASTER_ADDR=<host of rank 0> on every rank "
            "(or pass --master-addr)"
        )
    port = parse_int(port_text)
    if port is None or not 0 < port < 65536:
        shown = " is not set" if port_text is None else f"={port_text!r} is not a port number"
        fix = (
            "pass a TCP port, e.g. --master-port 29500"
            if port_var.startswith("-")
            else "export MASTER_PORT=29500 on every rank (or pass --master-port)"
        )
        raise UsageError(f"{port_var}{shown}: {fix}")
    torch_env = {**torch_env, "MASTER_ADDR": addr, "MASTER_PORT": str(port)}

    rank = _int(torch_env, "RANK")
    world = _int(torch_env, "WORLD_SIZE")
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"RANK={rank} must be at least 0 and below WORLD_SIZE={world}")
    local_world = parse_int(torch_env.get("LOCAL_WORLD_SIZE"))
    node_rank = parse_int(torch_env.get("GROUP_RANK"))
    if node_rank is None and launcher in ("env", "ray"):
        node_rank = parse_int(env.get("NODE_RANK"))
    return LaunchInfo(
        launcher=launcher,
        rank=rank,
        world_size=world,
        local_rank=parse_int(torch_env.get("LOCAL_RANK")) or 0,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=addr,
        master_port=port,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and master_addr is None
        and master_port is None,
        run_id=_run_id(launcher, env),
        torch_env=torch_env,
        addr_var=addr_var,
        port_var=port_var,
    )


def _master_vars(
    launcher: str,
    env: Mapping[str, str],
    master_addr: str | None,
    master_port: int | None,
    tcp_host: str | None,
    tcp_port: str | None,
) -> tuple[str, str]:
    """The names of what gave the master's address and port: a flag, --init-method, PET_*."""
    addr_var, port_var = (
        pet_master_vars(env) if launcher == "pet" else ("MASTER_ADDR", "MASTER_PORT")
    )
    if tcp_host:
        addr_var = "the host of --init-method"
    if tcp_port:
        port_var = "the port of --init-method"
    if master_addr:
        addr_var = "--master-addr"
    if master_port is not None:
        port_var = "--master-port"
    return addr_var, port_var


def _translated(translate, env: Mapping[str, str], what: str) -> dict[str, str]:
    try:
        return translate(env)
    except (SlurmEnvError, MpiEnvError) as exc:
        raise UsageError(f"{what} environment: {exc}") from None


def _int(env: Mapping[str, str], name: str) -> int:
    value = parse_int(env.get(name))
    if value is None:
        raise UsageError(f"{name}={env.get(name)!r} is not an integer")
    return value


def _tcp_endpoint(init_method: str | None) -> tuple[str | None, str | None]:
    if not init_method or not init_method.startswith("tcp://"):
        return None, None
    parsed = urlparse(init_method)
    try:
        port = str(parsed.port) if parsed.port is not None else None
    except ValueError:
        port = parsed.netloc.rpartition(":")[2] or None
    return parsed.hostname, port


def _run_id(launcher: str, env: Mapping[str, str]) -> str:
    if launcher == "torchrun":
        return (
            f"{env.get('TORCHELASTIC_RUN_ID', 'none')}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        )
    if launcher == "slurm":
        return f"{env.get('SLURM_JOB_ID', 'job')}.{env.get('SLURM_STEP_ID', 'step')}"
    if launcher == "pet":
        return f"pet.{env.get('PET_RDZV_ID', 'job')}"
    return launcher
