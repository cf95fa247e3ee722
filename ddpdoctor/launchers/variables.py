"""The variables each launcher sets for the processes it starts (torchrun, Slurm's srun, MPI), one
list for every module that reads, strips or reports them, and their integer parsing."""

from __future__ import annotations

# What the training script reads (torch.distributed's env:// and DDP's tutorials).
TORCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip
# torchrun's elastic agent only.
TORCHRUN_VARS = (
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
)  # fmt: skip
SLURM_VARS = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NNODES",
    "SLURM_STEP_NUM_NODES", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_JOB_NUM_NODES",
)  # fmt: skip
MPI_VARS = {
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "PMIx": ("PMIX_RANK", "PMIX_NAMESPACE"),
    "MPICH / Intel MPI (PMI)": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}  # fmt: skip


def parse_int(value: str | None) -> int | None:
    """A launcher variable's integer, or None when unset or not an integer."""
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None
