"""What `ddpdoctor run` will launch, worked out and checked before anything starts.

Every mistake the command line can carry (an unknown fault kind, a fault on a rank outside the
world, `--inject` with a user script, a script that does not exist, a bad `--nnodes`) is a
UsageError here: one line, exit 2, and no torchrun started. The plan also writes run.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ddpdoctor._version import __version__
from ddpdoctor.checks.probes.smoke import nvml_visible_gpus
from ddpdoctor.errors import UsageError
from ddpdoctor.launch.command import UserCommand, classify
from ddpdoctor.launch.torchrun_cmd import Rendezvous, program_argv
from ddpdoctor.reference.config import DEFAULT_STEPS, ReferenceConfig, reference_argv
from ddpdoctor.reference.inject import InjectSpec, parse_inject

DEFAULT_NPROC_WITHOUT_GPU = 2
REFERENCE_ONLY_FLAGS = ("steps", "model", "data", "batch_size")
SYNTHETIC_TRAIN_SAMPLES = ReferenceConfig().train_samples


@dataclass(frozen=True)
class LaunchPlan:
    nproc_per_node: int
    max_nodes: int
    backend: str  # "gloo" or "nccl": "auto" resolved here
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    script: str | None = None  # None: the reference job; "-m" means script_args[0] is a module
    script_args: tuple[str, ...] = ()
    injects: tuple[InjectSpec, ...] = ()
    total_steps: int | None = None  # the reference job's steps; unknown for a user script
    reference_args: tuple[str, ...] = ()
    run_dir: str | None = None
    hang_after: float | None = None
    keep_running: bool = False
    stop_on_divergence: bool = False  # --stop-on-divergence: replicas that diverged stop the job
    doctor: bool = True
    json: bool = False
    tui_allowed: bool = True  # False with --no-tui or --json
    workers: int | None = None
    ddp_buckets: bool = False  # --ddp-buckets: a Python comm hook records every gradient bucket
    argv: tuple[str, ...] = ()  # the ddpdoctor command line, for run.json
    # `-- COMMAND ARGS` of a program (python, torchrun, srun, ...): run as given, not under
    # ddpdoctor's torchrun; None for the reference job or a script
    command: UserCommand | None = None
    slurm_env: bool = True  # under srun, fill torch's variables from Slurm's (--no-slurm-env)

    @property
    def world_size(self) -> int | None:
        """None for a user's command: its ranks say how many they are when they join."""
        if self.command is not None:
            return None
        return self.nproc_per_node * self.max_nodes

    @property
    def node_rank(self) -> int | None:
        """This launcher's node in a job that spans nodes; None for a one-node job."""
        return self.rendezvous.node_rank if self.max_nodes > 1 else None

    @property
    def program(self) -> list[str]:
        return program_argv(self.script, self.script_args, self.reference_args)

    @property
    def checkup_scripts(self) -> tuple[str, ...]:
        """The user's script for the preflight's source checkup; none for the reference job, -m, or a
        program that is not a .py file."""
        if self.command is not None:
            found = self.command.python_script
            return (found,) if found else ()
        script = self.script or ""
        return (script,) if script.endswith(".py") else ()

    @property
    def job_name(self) -> str:
        if self.command is not None:  # "python multigpu.py", "torchrun train.py", "srun"
            program = os.path.basename(self.command.argv[0])
            script = self.command.python_script
            return f"{program} {os.path.basename(script)}" if script else program
        if self.script is None:
            return "reference"
        return self.script_args[0] if self.script == "-m" and self.script_args else self.script


def visible_gpu_count(env: dict[str, str] | None = None) -> int:
    """GPUs the ranks would see, from NVML (no torch import) and CUDA_VISIBLE_DEVICES; 0 on error."""
    return nvml_visible_gpus(dict(os.environ) if env is None else env)


def parse_nnodes(text: str | None) -> int:
    """The most nodes `--nnodes N` or `--nnodes MIN:MAX` allows (1 when not given)."""
    if text is None:
        return 1
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or any(n < 1 for n in numbers) or numbers != sorted(numbers):
        raise UsageError(f"--nnodes {text!r}: expected N or MIN:MAX with 1 <= MIN <= MAX")
    return numbers[-1]


def plan_from_args(
    args: argparse.Namespace,
    *,
    gpu_count: Callable[[], int] = visible_gpu_count,
    argv: Sequence[str] | None = None,
) -> LaunchPlan:
    injects = tuple(parse_inject(text) for text in args.inject)
    script = args.script
    if script is not None:
        command = classify([script, *args.script_args])
        if command.is_command:
            return _command_plan(args, command, injects, argv, gpu_count)
    if script is not None:
        _check_user_script(args, injects)
    max_nodes = parse_nnodes(args.nnodes)
    gpus: int | None = None
    if args.nproc is None or args.backend == "auto":
        gpus = gpu_count()
    nproc = args.nproc or gpus or DEFAULT_NPROC_WITHOUT_GPU
    backend = args.backend if args.backend != "auto" else ("nccl" if gpus else "gloo")
    rendezvous = Rendezvous(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        master_addr=args.master_addr,
        master_port=args.master_port,
        join_timeout_s=args.join_timeout,
    )
    if max_nodes > 1:
        _check_multi_node(args, max_nodes)
    elif args.join_timeout is not None:
        raise UsageError(
            "--join-timeout only applies to a job that spans nodes (--nnodes 2 or more)"
        )
    for spec in injects:
        spec.check_world(nproc * max_nodes)
    if args.data is not None and not Path(args.data).is_dir():
        raise UsageError(f"--data {args.data}: no such directory")
    reference = script is None
    if reference and args.data is None and args.batch_size:
        per_rank = SYNTHETIC_TRAIN_SAMPLES // (nproc * max_nodes)
        if args.batch_size > per_rank:
            raise UsageError(
                f"--batch-size {args.batch_size} is larger than each rank's share of the "
                f"synthetic data ({SYNTHETIC_TRAIN_SAMPLES} samples / {nproc * max_nodes} ranks "
                f"= {per_rank})"
            )
    steps = (args.steps or DEFAULT_STEPS) if reference else None
    ref_args = (
        reference_argv(
            steps=steps,
            model=args.model,
            data=str(Path(args.data).resolve()) if args.data else None,
            batch_size=args.batch_size,
            workers=args.workers,
            backend=backend,
            injects=injects,
        )
        if reference
        else []
    )
    return LaunchPlan(
        nproc_per_node=nproc,
        max_nodes=max_nodes,
        backend=backend,
        rendezvous=rendezvous,
        script=script,
        script_args=tuple(args.script_args),
        injects=injects,
        total_steps=steps,
        reference_args=tuple(ref_args),
        run_dir=args.run_dir,
        hang_after=args.hang_after,
        keep_running=args.keep_running,
        stop_on_divergence=getattr(args, "stop_on_divergence", False),
        doctor=not args.no_doctor,
        json=args.json,
        tui_allowed=not (args.no_tui or args.json),
        workers=args.workers,
        ddp_buckets=bool(getattr(args, "ddp_buckets", False)),
        argv=tuple(sys.argv[1:] if argv is None else argv),
    )


# Flags that shape ddpdoctor's own torchrun: a user's command starts its ranks its own way.
TORCHRUN_ONLY_FLAGS = (
    "nproc",
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "master_addr",
    "master_port",
    "join_timeout",
)


def _command_plan(
    args: argparse.Namespace,
    command: UserCommand,
    injects: tuple[InjectSpec, ...],
    argv: Sequence[str] | None,
    gpu_count: Callable[[], int],
) -> LaunchPlan:
    """`ddpdoctor run -- COMMAND ARGS`: the command runs as given and starts its own ranks."""
    if injects:
        raise UsageError(
            "--inject only works with the reference job: a command of yours runs unchanged"
        )
    flags = [*REFERENCE_ONLY_FLAGS, *TORCHRUN_ONLY_FLAGS]
    given = [f"--{name.replace('_', '-')}" for name in flags if getattr(args, name, None)]
    if given:
        raise UsageError(
            f"{', '.join(given)} only apply when ddpdoctor starts torchrun itself (-- SCRIPT); "
            f"'{command.argv[0]}' starts its ranks its own way: give them to it instead"
        )
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if gpu_count() else "gloo"
    return LaunchPlan(
        nproc_per_node=DEFAULT_NPROC_WITHOUT_GPU,  # for the preflight doctor only
        max_nodes=1,
        backend=backend,
        run_dir=args.run_dir,
        hang_after=args.hang_after,
        keep_running=args.keep_running,
        stop_on_divergence=getattr(args, "stop_on_divergence", False),
        doctor=not args.no_doctor,
        json=args.json,
        tui_allowed=not (args.no_tui or args.json),
        workers=args.workers,
        argv=tuple(sys.argv[1:] if argv is None else argv),
        command=command,
        slurm_env=not getattr(args, "no_slurm_env", False),
    )


def _check_multi_node(args: argparse.Namespace, max_nodes: int) -> None:
    """A job that spans nodes needs a place to meet and, for ddpdoctor, a name for each launcher:
    its --node-rank names its folders in the shared run directory (logs/<host>/node-<N>/,
    nodes/node-<N>/) and its answers to stack requests."""
    missing = []
    if args.node_rank is None:
        missing.append(f"--node-rank (this node's number, 0 to {max_nodes - 1})")
    if not (args.rdzv_endpoint or args.master_addr):
        missing.append("--rdzv-endpoint HOST:PORT (c10d rendezvous) or --master-addr/--master-port")
    if missing:
        raise UsageError(
            f"--nnodes {args.nnodes} spans several nodes: missing " + " and ".join(missing)
        )
    if args.node_rank >= max_nodes:
        raise UsageError(
            f"--node-rank {args.node_rank} is outside --nnodes {args.nnodes} (0 to {max_nodes - 1})"
        )


def _check_user_script(args: argparse.Namespace, injects: tuple[InjectSpec, ...]) -> None:
    if injects:
        raise UsageError(
            "--inject only works with the reference job: a script of yours runs unchanged "
            "(drop the script to inject faults into the reference job)"
        )
    given = [f"--{name.replace('_', '-')}" for name in REFERENCE_ONLY_FLAGS if getattr(args, name)]
    if given:
        raise UsageError(f"{', '.join(given)} only apply to the reference job, not to a script")
    if args.script == "-m":
        if not args.script_args:
            raise UsageError("'-- -m' needs a module name: ddpdoctor run -- -m package.train")
        return
    if not Path(args.script).is_file():
        raise UsageError(f"script not found: {args.script}")


def run_json_document(
    plan: LaunchPlan,
    *,
    run_dir: Path,
    torchrun: Sequence[str],
    started_t: float | None = None,
    torch_version: str | None = None,
) -> dict[str, Any]:
    """run.json: what was launched, for the monitor, for `watch` and for a bug report."""
    started = time.time() if started_t is None else started_t
    return {
        "schema_version": 1,
        "name": run_dir.name,
        "command": shlex.join(["ddpdoctor", *plan.argv]),
        "argv": ["ddpdoctor", *plan.argv],
        "torchrun": list(torchrun) if plan.command is None else None,
        "launch_mode": "torchrun" if plan.command is None else "command",
        "job_command": list(plan.command.argv) if plan.command is not None else list(torchrun),
        "launcher_kind": plan.command.kind if plan.command is not None else "torchrun",
        "slurm_env": plan.slurm_env,
        "script": plan.job_name,
        "script_args": list(plan.script_args) if plan.script and plan.command is None else [],
        "world_size": plan.world_size,
        "nproc_per_node": plan.nproc_per_node if plan.command is None else None,
        "nnodes": plan.max_nodes if plan.command is None else None,
        "node_rank": plan.rendezvous.node_rank,
        "backend": plan.backend,
        "hosts": [socket.gethostname()],
        "started_t": started,
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "versions": {
            "ddpdoctor": __version__,
            "torch": torch_version,
            "python": sys.version.split()[0],
        },
        "inject": [spec.text for spec in plan.injects],
        "total_steps": plan.total_steps,
        "hang_after": plan.hang_after,
        "keep_running": plan.keep_running,
        "launcher_pid": os.getpid(),
    }


def installed_torch_version() -> str | None:
    """torch's version from its package metadata (importing torch would cost seconds)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
