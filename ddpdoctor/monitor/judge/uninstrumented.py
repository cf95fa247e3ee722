"""Runs that ended without a rank, although the command ran: what to say instead of "not started".

- Its Python processes loaded ddpdoctor's runtime and none joined a process group
  (RUN_DIR/processes.jsonl, ddpdoctor.protocol.processes): NOT_DISTRIBUTED. `accelerate launch
  --cpu --num_processes 2` runs one such process; so does a script that never initializes.
- The runtime could not load: a process said why (a Python without ddpdoctor importable), or the
  command cannot load it at all (python -I / -E ignore PYTHONPATH, -S skips the site hook; a
  program that is not Python): NOT_INSTRUMENTED.

Only a launch of the user's own command (run.json `launch_mode: command`) qualifies: ddpdoctor's
own torchrun runs its ranks through the bootstrap, so for it no rank means not started.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.model.snapshot import Verdict
from ddpdoctor.protocol import processes
from ddpdoctor.protocol.rundir import RunDir

# Programs that start Python processes (which load the runtime through PYTHONPATH).
PYTHON_LAUNCHERS = frozenset(
    {"torchrun", "accelerate", "deepspeed", "srun", "mpirun", "mpiexec", "lightning", "fabric"}
    # ... and wrappers that run whatever follows them
    | {"env", "nohup", "time", "numactl", "taskset", "uv", "poetry", "conda", "pixi", "exec"}
)
# Interpreter options that keep PYTHONPATH's sitecustomize from running, and why.
NO_SITE_FLAGS = {
    "I": "python -I (isolated mode) ignores PYTHONPATH",
    "E": "python -E ignores PYTHONPATH",
    "S": "python -S skips the site module that runs sitecustomize",
}
FIX_PROGRAM = (
    "Run the Python program itself under ddpdoctor (ddpdoctor run -- python train.py), or a "
    "launcher that starts Python processes (torchrun, srun, mpirun, accelerate launch)."
)
FIX_FLAGS = (
    "Run the command without -I/-E/-S so that ddpdoctor can load into its processes (it comes "
    "in through PYTHONPATH)."
)


def ran_without_ranks(run: RunDir) -> tuple[Verdict, Finding] | None:
    """(NOT_DISTRIBUTED or NOT_INSTRUMENTED, the reason) for a command that ran without any of
    its processes becoming a rank; None when there is no sign the command ran."""
    data = run.read_run_json()
    if data.get("launch_mode") != "command":
        return None
    records = processes.read(run.path)
    failed = [r for r in records if r.load_error]
    if failed:
        first = failed[0]
        return Verdict.NOT_INSTRUMENTED, Finding(
            "run.not_instrumented",
            Severity.WARNING,
            f"the runtime could not load in {_count(len(failed))} of the command "
            f"({_name(first.argv)}{', ' + first.python if first.python else ''}): "
            f"{first.load_error}",
            "Install ddpdoctor in the Python the command runs (pip install ddpdoctor), or run "
            "the command with the Python ddpdoctor is installed in.",
        )
    never = [r for r in records if not r.load_error]
    if never:
        errors = [r for r in never if r.error]
        summary = (
            f"the command ran {_count(len(never))} that never joined a process group "
            f"({_name(never[0].argv)}): there was no distributed job to watch"
        )
        if errors:
            summary += f"; {_name(errors[0].argv)} ended with {errors[0].error}"
        return Verdict.NOT_DISTRIBUTED, Finding(
            "run.not_distributed",
            Severity.WARNING,
            summary,
            fix_for_engine(engine_of(never)),
        )
    job = data.get("job_command")
    why = cannot_load(job if isinstance(job, list) else [])
    if why is None:
        return None
    return Verdict.NOT_INSTRUMENTED, Finding(
        "run.not_instrumented",
        Severity.WARNING,
        f"the runtime could not load in this process: {why}; the job ran unwatched",
        FIX_FLAGS if why.startswith("python -") else FIX_PROGRAM,
    )


# What to do about a job that never formed a process group, by the engine its processes used.
FIX_NOT_DISTRIBUTED = {
    "ray": (
        "If the job was meant to be distributed, form the process group in Ray's workers: train "
        "with Ray Train's TorchTrainer (ScalingConfig(num_workers=N); its workers join the group "
        "and ray.train.torch.prepare_model wraps the model in DDP), or call "
        "torch.distributed.init_process_group in each actor that is a rank. Ray tasks and "
        "actors that never join a group are no distributed job to watch."
    ),
    "lightning": (
        "If the job was meant to be distributed, give the Trainer several devices and a DDP "
        'strategy (Trainer(accelerator=..., devices=N, strategy="ddp")), or run the script '
        "under torchrun, which Lightning then joins."
    ),
    "accelerate": (
        "If the job was meant to be distributed, make each process call "
        "torch.distributed.init_process_group (accelerate launch --cpu runs one process: for "
        "N ranks on CPUs run the script under torchrun with Accelerator(cpu=True), torchrun "
        "--nproc-per-node N train.py)."
    ),
    "deepspeed": (
        "If the job was meant to be distributed, start it with the deepspeed launcher (deepspeed "
        "--num_gpus N train.py) or torchrun, and call deepspeed.init_distributed() (or "
        "deepspeed.initialize) in each process."
    ),
}
FIX_NOT_DISTRIBUTED_ANY = (
    "If the job was meant to be distributed, make each process call "
    "torch.distributed.init_process_group, and start one process per rank (torchrun "
    "--nproc-per-node N train.py, srun, mpirun)."
)


def engine_of(records: Sequence[processes.ProcessRecord]) -> str | None:
    """The engine the job's processes used (the first known one any of them loaded)."""
    loaded = {e for r in records for e in r.engines}
    return next((e for e in processes.ENGINES if e in loaded), None)


def fix_for_engine(engine: str | None) -> str:
    return FIX_NOT_DISTRIBUTED.get(engine or "", FIX_NOT_DISTRIBUTED_ANY)


def cannot_load(argv: Sequence[object]) -> str | None:
    """Why a command's processes cannot load the runtime, judged from its words alone."""
    words = [str(w) for w in argv]
    if not words:
        return None
    name = os.path.basename(words[0])
    if name.startswith("python"):
        for word in words[1:]:
            if not word.startswith("-") or word in ("-m", "-c") or word.startswith("--"):
                break
            if word[1:2] in ("W", "X"):  # -W/-X take an argument: not flags of their own
                continue
            for flag, why in NO_SITE_FLAGS.items():
                if flag in word[1:]:
                    return why
        return None
    if name in PYTHON_LAUNCHERS or name.endswith((".sh", ".bash")) or name in ("bash", "sh"):
        return None  # they start Python processes (or may): no sign either way
    return f"{name} is not a Python program (the runtime loads only into Python processes)"


def _count(n: int) -> str:
    return "1 process" if n == 1 else f"{n} processes"


def _name(argv: Sequence[str]) -> str:
    return " ".join(argv[:3])[:120] or "a Python process"
