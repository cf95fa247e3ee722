"""Running a user's own launch command (`ddpdoctor run -- python|torchrun|srun|... ARGS`).

ddpdoctor runs the command exactly as given; what changes is only its environment: the job's
usual one (run directory, unbuffered output, NCCL logs: torchrun_cmd.job_env) plus
ddpdoctor/runtime/site first on PYTHONPATH, whose sitecustomize brings the runtime up in every
Python process of the job (ddpdoctor/runtime/autostart.py: a process becomes a rank when it joins
a process group). A Ray job's workers get the same through the job's runtime_env
(runtime/ray_env.py). Under srun the ranks fill torch's variables from Slurm's unless `--no-slurm-env`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from ddpdoctor.launch.torchrun_cmd import job_env
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.runtime.autostart import ENV_SLURM_ENV, with_site_dir
from ddpdoctor.runtime.ray_env import hook_env

GUARD_MODULE = "ddpdoctor.launch.job_guard"


def guarded_argv(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """The command under the job guard (job_guard.py): nothing of it outlives ddpdoctor."""
    return [python, "-m", GUARD_MODULE, *command]


def command_env(
    base: Mapping[str, str],
    *,
    run_dir: RunDir,
    backend: str,
    torch_version: str | None,
    slurm_env: bool = True,
) -> dict[str, str]:
    env = job_env(base, run_dir=run_dir, backend=backend, torch_version=torch_version)
    env["PYTHONPATH"] = with_site_dir(base.get("PYTHONPATH"))
    # a Ray job's workers are the raylet's children: Ray's runtime-env hook brings them the same
    env.update(hook_env(base))
    if not slurm_env:
        env[ENV_SLURM_ENV] = "0"
    return env
