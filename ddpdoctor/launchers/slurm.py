"""torch.distributed's variables from Slurm's, for jobs started by `srun` without torchrun.

srun starts one task per rank and describes it with SLURM_* variables; torch's env:// rendezvous
wants RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. The translation (F06 in the failure catalog):

    RANK               SLURM_PROCID
    WORLD_SIZE         SLURM_STEP_NUM_TASKS, else SLURM_NTASKS, else SLURM_NPROCS (the step's
                       count first: a job-level count larger than the step makes init wait forever)
    LOCAL_RANK         SLURM_LOCALID
    LOCAL_WORLD_SIZE   this node's entry of SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE
                       ("2(x3),1"), else SLURM_NTASKS_PER_NODE
    GROUP_RANK         SLURM_NODEID (the node's index in the step, as torchrun's GROUP_RANK)
    GROUP_WORLD_SIZE   SLURM_STEP_NUM_NODES, else SLURM_JOB_NUM_NODES, else SLURM_NNODES
    MASTER_ADDR        MASTER_ADDR if set, else the first host of SLURM_STEP_NODELIST /
                       SLURM_JOB_NODELIST / SLURM_NODELIST (task 0 runs on the step's first node)
    MASTER_PORT        MASTER_PORT if set, else 15000 + the last four digits of SLURM_JOB_ID, so
                       two jobs sharing a node rarely pick the same port

    >>> from ddpdoctor.launchers.slurm import torch_env_from_slurm
    >>> os.environ.update(torch_env_from_slurm(os.environ))   # before init_process_group
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpdoctor.launchers.hostlist import (
    HostlistError,
    expand_hostlist,
    expand_tasks_per_node,
    first_host,
)

DEFAULT_PORT_BASE = 15000
FALLBACK_PORT = 29500
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
WORLD_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
NODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


class SlurmEnvError(ValueError):
    """A Slurm environment that cannot be translated; the message names the variable and the fix."""


def in_slurm_step(env: Mapping[str, str]) -> bool:
    """True inside a task started by srun (a batch script alone has a job id but is one task)."""
    return "SLURM_PROCID" in env and any(name in env for name in WORLD_VARS)


def torch_env_from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT for this srun task. Raises SlurmEnvError naming what is missing or wrong."""
    rank = _required_int(env, ("SLURM_PROCID",), "run the command under srun")
    world = _required_int(env, WORLD_VARS, "run the command under srun with --ntasks")
    if not 0 <= rank < world:
        raise SlurmEnvError(
            f"SLURM_PROCID={rank} is not below the task count {world}: the step's task count "
            "and the job's differ; take the count from SLURM_STEP_NUM_TASKS"
        )
    local_rank = _required_int(env, ("SLURM_LOCALID",), "run the command under srun")
    node_rank = _optional_int(env, "SLURM_NODEID")
    result = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
    }
    local_world = _local_world_size(env, node_rank)
    if local_world is not None:
        if not 0 <= local_rank < local_world:
            raise SlurmEnvError(
                f"SLURM_LOCALID={local_rank} is not below this node's task count {local_world}"
            )
        result["LOCAL_WORLD_SIZE"] = str(local_world)
    if node_rank is not None:
        result["GROUP_RANK"] = str(node_rank)
    nodes = next((_optional_int(env, name) for name in NODES_VARS if name in env), None)
    if nodes is not None:
        result["GROUP_WORLD_SIZE"] = str(nodes)
    result["MASTER_ADDR"] = env.get("MASTER_ADDR") or _master_from_nodelist(env)
    result["MASTER_PORT"] = env.get("MASTER_PORT") or str(derived_port(env.get("SLURM_JOB_ID")))
    return result


def derived_port(job_id: str | None) -> int:
    """15000-24999 from the job id's last four digits; 29500 when there is no usable job id."""
    digits = "".join(ch for ch in (job_id or "") if ch.isdigit())
    if not digits:
        return FALLBACK_PORT
    return DEFAULT_PORT_BASE + int(digits[-4:])


def _master_from_nodelist(env: Mapping[str, str]) -> str:
    for name in NODELIST_VARS:
        text = env.get(name)
        if not text:
            continue
        try:
            host = first_host(text)
        except HostlistError as exc:
            raise SlurmEnvError(f"{name}: {exc}") from None
        if host:
            return host
    raise SlurmEnvError(
        "cannot tell the master host: MASTER_ADDR is unset and so are "
        f"{', '.join(NODELIST_VARS)} (export MASTER_ADDR=<first host of the job>)"
    )


def _local_world_size(env: Mapping[str, str], node_rank: int | None) -> int | None:
    for name in TASKS_PER_NODE_VARS:
        text = env.get(name)
        if not text:
            continue
        try:
            counts = expand_tasks_per_node(text)
        except HostlistError as exc:
            raise SlurmEnvError(f"{name}: {exc}") from None
        if len(counts) == 1:
            return counts[0]
        if node_rank is None:
            raise SlurmEnvError(f"{name}={text} differs per node but SLURM_NODEID is unset")
        if node_rank >= len(counts):
            raise SlurmEnvError(f"SLURM_NODEID={node_rank} is beyond {name}={text}")
        return counts[node_rank]
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node:
        return _parse_int("SLURM_NTASKS_PER_NODE", per_node.split("(")[0])
    return None


def _required_int(env: Mapping[str, str], names: tuple[str, ...], fix: str) -> int:
    for name in names:
        if name in env:
            return _parse_int(name, env[name])
    raise SlurmEnvError(f"{' / '.join(names)} is not set: not inside an srun step ({fix})")


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    return _parse_int(name, env[name]) if name in env else None


def _parse_int(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise SlurmEnvError(f"{name}={text!r} is not an integer") from None
    if value < 0:
        raise SlurmEnvError(f"{name}={text!r} is negative")
    return value


def task_hosts(env: Mapping[str, str]) -> list[str] | None:
    """The host of every task of the step, by rank, under Slurm's default block distribution
    (tasks fill a node before the next); None when the step does not say enough."""
    nodelist = next((env[name] for name in NODELIST_VARS if env.get(name)), None)
    per_node_text = next((env[name] for name in TASKS_PER_NODE_VARS if env.get(name)), None)
    if not nodelist or not per_node_text:
        return None
    try:
        hosts = expand_hostlist(nodelist)
        counts = expand_tasks_per_node(per_node_text)
    except HostlistError:
        return None
    if len(counts) == 1:
        counts = counts * len(hosts)
    if len(counts) != len(hosts):
        return None
    return [host for host, count in zip(hosts, counts, strict=True) for _ in range(count)]
