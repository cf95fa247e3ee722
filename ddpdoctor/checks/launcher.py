"""Launcher checks: who started us, and whether RANK / WORLD_SIZE / MASTER_* make sense.

Failure modes F01 (env:// variables missing or malformed, swapped MASTER_ADDR/MASTER_PORT), F04
(LOCAL_RANK beyond the visible GPUs), F05/F06 (Slurm job-level vs step-level counts, srun and
torchrun both spawning) and F07 (inconsistent per-node values).
"""

from __future__ import annotations

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.gpu_plan import job_backend, visible_gpu_count
from ddpdoctor.checks.model import CheckOutcome, skipped
from ddpdoctor.checks.plan import parse_int
from ddpdoctor.checks.problems import Problem, outcome_from
from ddpdoctor.checks.registry import check
from ddpdoctor.launchers.detect import (
    TORCH_VARS,
    detect_launcher,
    mpi_local_size,
    slurm_tasks_per_node,
)
from ddpdoctor.launchers.kubernetes import PetConfig

SLURM_MAPPING = (
    "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_STEP_NUM_TASKS LOCAL_RANK=$SLURM_LOCALID "
    "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) MASTER_PORT=29500"
)
ONE_SPAWNER = (
    "use one spawner: `srun --ntasks-per-node=1 torchrun --nproc-per-node=<GPUs> ...`, or srun "
    f"alone with --ntasks-per-node=<GPUs> and the mapping {SLURM_MAPPING}"
)
TORCHRUN_HINT = "launch with torchrun (e.g. `torchrun --nproc-per-node=2 train.py`), which sets it"


@check("launcher.detect", "Launcher")
def launcher_detect(ctx: CheckContext) -> CheckOutcome:
    info = detect_launcher(ctx.env)
    facts: dict[str, object] = {"launcher": info.name, "variables": info.seen}
    problems: list[Problem] = []
    if info.torchrun and info.slurm:
        per_node, source = slurm_tasks_per_node(ctx.env)
        if per_node and per_node > 1 and source is not None:
            double = (
                f"srun starts {per_node} tasks per node ({source}={ctx.env[source]}) and each "
                "runs torchrun, which starts its own ranks: "
                f"{per_node} x {ctx.env.get('LOCAL_WORLD_SIZE', 'N')} processes per node (F06)"
            )
            # In an srun step that is certain; in a batch script it may be torchrun run once.
            problems.append(Problem(double, fix=ONE_SPAWNER, fatal=info.srun_step))
    if info.torchrun and info.mpi:
        local = mpi_local_size(ctx.env)
        if local and local > 1:
            problems.append(
                Problem(
                    f"mpirun starts {local} processes per node and each runs torchrun: every "
                    "GPU gets several ranks",
                    fix="start one torchrun per node (mpirun --npernode 1 torchrun ...), or "
                    "drop torchrun and map OMPI_COMM_WORLD_* to RANK / WORLD_SIZE / LOCAL_RANK",
                )
            )
    details = [f"{name}={value}" for name, value in sorted(info.seen.items())]
    if not info.any:
        details.insert(0, "no launcher variables: run the job with torchrun, srun or mpirun")
    summary = f"started by {info.name}"
    if info.pet is not None:
        # in a pod, torchrun's PET_* variables are the launch (Kubeflow's PyTorchJob, Trainer)
        summary += f": {info.pet.describe()}"
        facts["pet"] = {
            "nnodes": info.pet.nnodes,
            "nproc_per_node": info.pet.nproc_per_node,
            "node_rank": info.pet.node_rank,
            "master_addr": info.pet.master_addr,
            "master_port": info.pet.master_port,
        }
        problems.extend(pet_problems(info.pet))
    facts["kubernetes"] = info.kubernetes
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def pet_problems(pet: PetConfig) -> list[Problem]:
    """What torchrun would refuse or misread in the PET_* variables."""
    out = []
    if (pet.nnodes or 1) > 1 and not pet.master_addr:
        out.append(
            Problem(
                f"PET_NNODES={pet.seen.get('PET_NNODES')} but neither PET_MASTER_ADDR nor "
                "PET_RDZV_ENDPOINT is set: the pods cannot find each other",
                fix="Set PET_MASTER_ADDR to the master pod's service name (Kubeflow sets it "
                "for a PyTorchJob with more than one replica).",
            )
        )
    if pet.nnodes is not None and pet.node_rank is not None and not 0 <= pet.node_rank < pet.nnodes:
        out.append(
            Problem(
                f"PET_NODE_RANK={pet.node_rank} is not below PET_NNODES={pet.nnodes}",
                fix="Each pod's PET_NODE_RANK must be 0..PET_NNODES-1 (Kubeflow sets it from "
                "the replica index).",
                fatal=True,
            )
        )
    return out


@check("launcher.env", "Rank environment")
def launcher_env(ctx: CheckContext) -> CheckOutcome:
    env = ctx.env
    info = detect_launcher(env)
    present = {name: env[name] for name in TORCH_VARS if name in env}
    facts: dict[str, object] = {"launcher": info.name, "init_method": ctx.plan.init_method}
    if not present and not info.torchrun:
        where = "inside a Slurm job" if info.slurm else "inside mpirun" if info.mpi else None
        if where:
            return skipped(
                f"{where}, but RANK / WORLD_SIZE are not set yet: torchrun, or your "
                "Slurm/MPI-to-torch mapping, sets them at launch (see launcher.slurm)",
                facts=facts,
            )
        return skipped(
            "not inside a launcher; torchrun will set RANK, WORLD_SIZE, LOCAL_RANK, "
            "MASTER_ADDR and MASTER_PORT",
            facts=facts,
        )
    values, problems = _integers(env)
    problems += _master_problems(ctx)
    problems += _missing_for_env_init(ctx, info.slurm)
    problems += _range_problems(values)
    problems += _consistency_problems(values, torchrun=info.torchrun)
    problems += _gpu_binding_problems(ctx, values)
    facts.update({k.lower(): v for k, v in values.items()})
    facts["master_addr"] = ctx.plan.master_addr
    facts["master_port"] = ctx.plan.master_port_text
    rank, world = values.get("RANK"), values.get("WORLD_SIZE")
    summary = (
        f"rank {rank} of {world}" if rank is not None and world is not None else "values valid"
    )
    if "LOCAL_RANK" in values:
        summary += f", local rank {values['LOCAL_RANK']}"
        if "LOCAL_WORLD_SIZE" in values:
            summary += f" of {values['LOCAL_WORLD_SIZE']}"
    if ctx.plan.master_addr and ctx.plan.master_port_text:
        summary += f", master {ctx.plan.master_addr}:{ctx.plan.master_port_text}"
    details = [f"{name}={value}" for name, value in sorted(present.items())]
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _integers(env) -> tuple[dict[str, int], list[Problem]]:
    values: dict[str, int] = {}
    problems: list[Problem] = []
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        if name not in env:
            continue
        number = parse_int(env[name])
        if number is None:
            problems.append(
                Problem(
                    f"{name}={env[name]!r} is not an integer",
                    fix=f"set {name} to an integer, or {TORCHRUN_HINT}",
                )
            )
        else:
            values[name] = number
    return values, problems


def _master_problems(ctx: CheckContext) -> list[Problem]:
    addr = ctx.env.get("MASTER_ADDR")
    port = ctx.env.get("MASTER_PORT")
    problems: list[Problem] = []
    if addr is not None and port is not None and parse_int(port) is None and addr.strip().isdigit():
        return [
            Problem(
                f"MASTER_ADDR={addr!r} and MASTER_PORT={port!r} look swapped (F01)",
                fix=f"export MASTER_ADDR={port.strip()} MASTER_PORT={addr.strip()}",
            )
        ]
    if port is not None and parse_int(port) is None:
        problems.append(
            Problem(
                f"MASTER_PORT={port!r} is not a port number",
                fix="set MASTER_PORT to a free TCP port number, e.g. MASTER_PORT=29500",
            )
        )
    if addr is not None and not addr.strip():
        problems.append(
            Problem(
                "MASTER_ADDR is set but empty",
                fix="set MASTER_ADDR to the host name or IP address of the rank-0 node",
            )
        )
    return problems


def _missing_for_env_init(ctx: CheckContext, slurm: bool) -> list[Problem]:
    if ctx.plan.scheme != "env":
        return []  # tcp:// and file:// take rank and world size as arguments
    env = ctx.env
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in env]
    if not ctx.plan.master_addr and "MASTER_ADDR" not in env:
        missing.append("MASTER_ADDR")
    if not ctx.plan.master_port_text and "MASTER_PORT" not in env:
        missing.append("MASTER_PORT")
    if not missing:
        return []
    verb = "is" if len(missing) == 1 else "are"
    if slurm:
        fix = f"srun sets SLURM_PROCID, not RANK: {SLURM_MAPPING}, or run torchrun under srun"
    else:
        fix = f"{TORCHRUN_HINT}; or export {' '.join(f'{m}=...' for m in missing)}"
    return [
        Problem(
            f"init_method env:// needs {', '.join(missing)}, which {verb} not set: "
            f"init_process_group fails with 'environment variable {missing[0]} expected, but "
            "not set' (F01)",
            fix=fix,
        )
    ]


# torch's process group takes ranks and sizes as a C int
MAX_C10D_INT = 2**31 - 1


def _range_problems(values: dict[str, int]) -> list[Problem]:
    problems: list[Problem] = []
    rank, world = values.get("RANK"), values.get("WORLD_SIZE")
    local, local_world = values.get("LOCAL_RANK"), values.get("LOCAL_WORLD_SIZE")
    if world is not None and world < 1:
        problems.append(
            Problem(
                f"WORLD_SIZE={world} must be at least 1",
                fix="set WORLD_SIZE to the total number of ranks",
            )
        )
    for name in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        value = values.get(name)
        if value is not None and value > MAX_C10D_INT:
            problems.append(
                Problem(
                    f"{name}={value} is larger than init_process_group accepts "
                    f"(at most {MAX_C10D_INT})",
                    fix=f"set {name} to a real count: WORLD_SIZE = nodes x ranks per node",
                )
            )
    if rank is not None and rank < 0:
        problems.append(
            Problem(
                f"RANK={rank} is negative",
                fix="RANK runs from 0 to WORLD_SIZE-1, one value per process",
            )
        )
    elif rank is not None and world is not None and world >= 1 and rank >= world:
        problems.append(
            Problem(
                f"RANK={rank} is not below WORLD_SIZE={world}: init_process_group rejects it",
                fix=f"RANK must be 0..{world - 1}; check WORLD_SIZE = nodes x ranks per node "
                "(the same on every node) and the node rank of this host",
            )
        )
    if local_world is not None and local_world < 1:
        problems.append(
            Problem(
                f"LOCAL_WORLD_SIZE={local_world} must be at least 1",
                fix="set LOCAL_WORLD_SIZE to the number of ranks on this node",
            )
        )
    if local is not None and local < 0:
        problems.append(
            Problem(
                f"LOCAL_RANK={local} is negative",
                fix="LOCAL_RANK runs from 0 to LOCAL_WORLD_SIZE-1 on each node",
            )
        )
    elif local is not None and local_world and local_world >= 1 and local >= local_world:
        problems.append(
            Problem(
                f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_world}",
                fix=f"LOCAL_RANK must be 0..{local_world - 1} on this node",
            )
        )
    return problems


def _consistency_problems(values: dict[str, int], *, torchrun: bool) -> list[Problem]:
    problems: list[Problem] = []
    rank, world = values.get("RANK"), values.get("WORLD_SIZE")
    local, local_world = values.get("LOCAL_RANK"), values.get("LOCAL_WORLD_SIZE")
    group = values.get("GROUP_RANK")
    if not (world and local_world and world >= 1 and local_world >= 1):
        return problems
    if local_world > world:
        problems.append(
            Problem(
                f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}",
                fix="WORLD_SIZE counts the ranks of all nodes: nodes x ranks per node",
            )
        )
        return problems
    if world % local_world:
        problems.append(
            Problem(
                f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}: "
                "nodes run different numbers of ranks",
                fix="use the same --nproc-per-node on every node (F07), unless the nodes "
                "really differ",
                fatal=False,
            )
        )
    elif torchrun and rank is not None and local is not None and group is not None:
        expected = group * local_world + local
        if expected != rank:
            problems.append(
                Problem(
                    f"RANK={rank} but GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK = "
                    f"{group}*{local_world}+{local} = {expected}",
                    fix="let torchrun assign the ranks: do not export RANK, LOCAL_RANK or "
                    "GROUP_RANK yourself around torchrun",
                )
            )
    return problems


def _gpu_binding_problems(ctx: CheckContext, values: dict[str, int]) -> list[Problem]:
    local = values.get("LOCAL_RANK")
    if local is None or local < 0 or job_backend(ctx) != "nccl":
        return []
    gpus = visible_gpu_count(ctx)
    if gpus == 0 or local < gpus:
        return []
    shown = ctx.env.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
    return [
        Problem(
            f"LOCAL_RANK={local} but only {gpus} GPU{'s' if gpus != 1 else ''} visible{where}: "
            f"torch.cuda.set_device({local}) fails with 'invalid device ordinal' (F04)",
            fix=f"start at most {gpus} ranks on this node (--nproc-per-node={gpus}) or make "
            "more GPUs visible",
        )
    ]


@check("launcher.slurm", "Slurm")
def launcher_slurm(ctx: CheckContext) -> CheckOutcome:
    env = ctx.env
    info = detect_launcher(env)
    if not info.slurm:
        return skipped("not inside a Slurm job")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    step_tasks = parse_int(env.get("SLURM_STEP_NUM_TASKS"))
    job_tasks = parse_int(env.get("SLURM_NTASKS"))
    tasks = step_tasks if step_tasks is not None else job_tasks
    nodes = parse_int(env.get("SLURM_STEP_NUM_NODES")) or parse_int(env.get("SLURM_NNODES"))
    procid, localid = parse_int(env.get("SLURM_PROCID")), parse_int(env.get("SLURM_LOCALID"))
    facts = {
        "job_id": job_id,
        "step_id": env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"),
        "job_tasks": job_tasks,
        "step_tasks": step_tasks,
        "nodes": nodes,
        "procid": procid,
        "localid": localid,
        "tasks_per_node": slurm_tasks_per_node(env)[0],
    }
    details = [f"{k}={env[k]}" for k in sorted(env) if k.startswith("SLURM_") and k in info.seen]
    if job_tasks is not None and step_tasks is not None and job_tasks != step_tasks:
        details.append(f"the job has {job_tasks} tasks; this srun step runs {step_tasks}")
    rank, world = parse_int(env.get("RANK")), parse_int(env.get("WORLD_SIZE"))
    local = parse_int(env.get("LOCAL_RANK"))
    problems: list[Problem] = []
    if info.torchrun:
        # srun starts one torchrun agent per node; torchrun assigns the ranks.
        local_world = parse_int(env.get("LOCAL_WORLD_SIZE"))
        if world and local_world and nodes and world != nodes * local_world:
            problems.append(
                Problem(
                    f"WORLD_SIZE={world} but the step spans {nodes} node"
                    f"{'s' if nodes != 1 else ''} x LOCAL_WORLD_SIZE={local_world}",
                    fix=f"pass torchrun --nnodes={nodes} (e.g. --nnodes=$SLURM_NNODES)",
                )
            )
        summary = f"job {job_id}: torchrun under srun, {nodes or '?'} node(s)"
        return outcome_from(problems, ok_summary=summary, details=details, facts=facts)
    if rank is None and world is None:
        if info.srun_step and (tasks or 0) > 1:
            problems.append(
                Problem(
                    f"this srun step runs {tasks} tasks but RANK / WORLD_SIZE are not set: "
                    "init_process_group('env://') fails with KeyError 'RANK' unless your "
                    "code maps SLURM_PROCID itself (F06)",
                    fix=SLURM_MAPPING,
                    fatal=False,
                )
            )
        summary = f"job {job_id}" + (f", task {procid} of {tasks}" if tasks else "")
        return outcome_from(problems, ok_summary=summary, details=details, facts=facts)
    problems += _slurm_mapping_problems(env, rank, world, local, procid, localid, step_tasks)
    summary = f"job {job_id}: RANK, WORLD_SIZE and LOCAL_RANK match SLURM_PROCID/NTASKS/LOCALID"
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _slurm_mapping_problems(env, rank, world, local, procid, localid, step_tasks) -> list[Problem]:
    problems: list[Problem] = []
    job_tasks = parse_int(env.get("SLURM_NTASKS"))
    if world is not None and step_tasks is not None and world != step_tasks:
        from_job = job_tasks is not None and world == job_tasks
        problems.append(
            Problem(
                f"WORLD_SIZE={world} but this srun step runs SLURM_STEP_NUM_TASKS={step_tasks}"
                + (
                    f" (WORLD_SIZE was taken from the job-level SLURM_NTASKS={job_tasks})"
                    if from_job
                    else ""
                )
                + ": init waits for ranks that never start (F05)",
                fix="export WORLD_SIZE=$SLURM_STEP_NUM_TASKS",
            )
        )
    if rank is not None and procid is not None and rank != procid:
        problems.append(
            Problem(
                f"RANK={rank} but SLURM_PROCID={procid}",
                fix="export RANK=$SLURM_PROCID (SLURM_NODEID is the node, not the rank)",
            )
        )
    if local is not None and localid is not None and local != localid:
        problems.append(
            Problem(
                f"LOCAL_RANK={local} but SLURM_LOCALID={localid}",
                fix="export LOCAL_RANK=$SLURM_LOCALID",
            )
        )
    return problems
