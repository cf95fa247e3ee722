"""Which launcher started this process, told from the variables each one sets.

torchrun (and the deprecated `python -m torch.distributed.launch`, which runs the same elastic
agent) sets TORCHELASTIC_RUN_ID, GROUP_RANK and LOCAL_WORLD_SIZE next to RANK and WORLD_SIZE.
Slurm sets SLURM_JOB_ID for the whole allocation and SLURM_STEP_ID / SLURM_STEP_NUM_TASKS in a task
started by srun. Open MPI sets OMPI_COMM_WORLD_*, MPICH and Intel MPI PMI_*, PMIx launchers PMIX_*.
RANK and WORLD_SIZE with none of these were set by hand (or by code such as mp.spawn wrappers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddpdoctor.launchers.kubernetes import KUBERNETES_VARS, PetConfig, in_kubernetes, pet_config
from ddpdoctor.launchers.variables import (
    MPI_VARS,
    SLURM_VARS,
    TORCH_VARS,
    TORCHRUN_VARS,
    parse_int,
)


@dataclass(frozen=True)
class LauncherInfo:
    torchrun: bool
    slurm: bool  # inside a Slurm allocation
    srun_step: bool  # this process is a task started by srun (not the batch script)
    mpi: str | None  # which MPI flavour, if any
    manual: bool  # RANK / WORLD_SIZE set with no launcher's own variables
    seen: dict[str, str] = field(default_factory=dict)
    kubernetes: bool = False  # in a Kubernetes pod
    pet: PetConfig | None = None  # torchrun's PET_* variables (Kubeflow), when set

    @property
    def name(self) -> str:
        parts = []
        if self.torchrun:
            parts.append("torchrun")
        if self.slurm:
            parts.append("srun" if self.srun_step else "Slurm batch job")
        if self.mpi:
            parts.append(f"mpirun ({self.mpi})")
        if self.pet is not None and not self.torchrun:
            parts.append("torchrun's PET_* variables (torchrun not started yet)")
        if not parts:
            parts.append("set by hand" if self.manual else "plain python (no launcher)")
        name = " inside ".join(parts) if len(parts) > 1 else parts[0]
        return f"{name} in a Kubernetes pod" if self.kubernetes else name

    @property
    def any(self) -> bool:
        return self.torchrun or self.slurm or bool(self.mpi) or self.manual or self.pet is not None


def detect_launcher(env: Mapping[str, str]) -> LauncherInfo:
    seen = {name: env[name] for name in (*TORCH_VARS, *TORCHRUN_VARS, *SLURM_VARS) if name in env}
    mpi = None
    for flavour, names in MPI_VARS.items():
        present = {n: env[n] for n in names if n in env}
        if present:
            mpi = mpi or flavour
            seen.update(present)
    torchrun = "TORCHELASTIC_RUN_ID" in env
    slurm = "SLURM_JOB_ID" in env or "SLURM_JOBID" in env
    srun_step = slurm and "SLURM_STEP_NUM_TASKS" in env
    manual = not (torchrun or slurm or mpi) and ("RANK" in env or "WORLD_SIZE" in env)
    pet = pet_config(env)
    if pet is not None:
        seen.update(pet.seen)
    seen.update({name: env[name] for name in KUBERNETES_VARS if name in env})
    return LauncherInfo(
        torchrun, slurm, srun_step, mpi, manual, seen, kubernetes=in_kubernetes(env), pet=pet
    )


def first_count(text: str | None) -> int | None:
    """Slurm's per-node task lists ("8(x2),4") -> the first node's count (8)."""
    if not text:
        return None
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else None


def slurm_tasks_per_node(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """Tasks srun starts on this node for this step, and the variable it came from."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        count = first_count(env.get(name))
        if count is not None:
            return count, name
    return None, None


def mpi_local_size(env: Mapping[str, str]) -> int | None:
    return parse_int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE")) or parse_int(env.get("MPI_LOCALNRANKS"))
