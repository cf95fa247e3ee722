"""The runtime in every Python process of a job that ddpdoctor did not start itself.

`ddpdoctor run -- COMMAND` puts ddpdoctor/runtime/site/ first on the job's PYTHONPATH; its
sitecustomize calls `on_startup()` in every Python process the command starts, before the
process runs any code of its own. What happens there:

1. Launchers are left alone: torchrun's agent (`torchrun`, `python -m torch.distributed.run`),
   `accelerate launch`, `deepspeed`, and multiprocessing's helper processes.
2. Under srun with no torch variables, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
   MASTER_ADDR and MASTER_PORT are filled from Slurm's (as Lightning's SLURMEnvironment does;
   the mapping is ddpdoctor.launchers.slurm), unless $DDPDOCTOR_SLURM_ENV is "0". The ranks'
   hello event says so (`env_from: "slurm"`, `env_filled: [...]`).
3. A post-import hook waits for `torch.distributed`. Once it is imported, `init_process_group`
   is wrapped: **a process is a rank when it joins a process group**. At that call the runtime
   starts (hooks, heartbeat; what it records is held in memory while the rank is unknown) and
   when the call returns the process takes its rank from the process group, opens
   events/rank-<R>.jsonl and writes what it held. A process that never joins (the mp.spawn
   parent, a DataLoader worker, a compile worker, a helper script) writes no events; at exit it
   leaves one line in RUN_DIR/processes.jsonl (ddpdoctor.protocol.processes), so a job none of
   whose processes joined ends as "not distributed", not "not started".
4. In a Ray worker (started by the raylet, reached through the job's runtime_env: ray_env.py),
   the user's calls (actor methods, Ray Train's training function) are tracked (ray_worker.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from ddpdoctor.launchers.slurm import SlurmEnvError, in_slurm_step, torch_env_from_slurm
from ddpdoctor.protocol import processes
from ddpdoctor.protocol.rundir import ENV_RUN_DIR
from ddpdoctor.runtime import ray_worker
from ddpdoctor.runtime.import_hooks import _AfterImport, warn, when_imported
from ddpdoctor.runtime.info import ENV_FILLED, ENV_FILLED_FROM

__all__ = ["_AfterImport", "on_startup", "when_imported", "wrap_init_process_group"]

# The folder whose sitecustomize.py calls on_startup(); `ddpdoctor run` prepends it to PYTHONPATH.
SITE_DIR = Path(__file__).resolve().parent / "site"
ENV_AUTOSTART = "DDPDOCTOR_AUTOSTART"  # "0": the sitecustomize does nothing
ENV_SLURM_ENV = "DDPDOCTOR_SLURM_ENV"  # "0": leave Slurm's variables untranslated (--no-slurm-env)
WATCHED_MODULE = "torch.distributed"
# torchft never calls init_process_group: its Manager is where a process joins (torchft_hooks.py)
TORCHFT_MANAGER = "torchft.manager"
TORCHFT_PROCESS_GROUP = "torchft.process_group"
SLURM_FILLED = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)

# Python processes that start ranks but never are one: their argv as python saw it.
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate.commands.launch",
        "deepspeed.launcher.launch",
        "deepspeed.launcher.runner",
        "ddpdoctor.launch.job_guard",  # ddpdoctor's own guard around a user's command
    }
)
LAUNCHER_SCRIPTS = frozenset({"torchrun", "accelerate", "deepspeed"})
HELPER_SNIPPETS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def with_site_dir(pythonpath: str | None, site_dir: str = str(SITE_DIR)) -> str:
    """PYTHONPATH with the sitecustomize folder first (once); the user's entries keep their
    order after it, and their own sitecustomize still runs (ours chains to it)."""
    entries = [p for p in (pythonpath or "").split(os.pathsep) if p and p != site_dir]
    return os.pathsep.join([site_dir, *entries])


def is_launcher(orig_argv: Sequence[str]) -> bool:
    """The interpreter's command line (sys.orig_argv) is a launcher's or multiprocessing's own."""
    args = list(orig_argv[1:])
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args.pop(0)  # interpreter options: -u, -B, -X ...
    if not args:
        return False
    if args[0] == "-m":
        return len(args) > 1 and args[1] in LAUNCHER_MODULES
    if args[0] == "-c":
        return len(args) > 1 and any(snippet in args[1] for snippet in HELPER_SNIPPETS)
    return os.path.basename(args[0]) in LAUNCHER_SCRIPTS


def fill_from_slurm(env: MutableMapping[str, str]) -> tuple[str, ...]:
    """Fill torch's variables from Slurm's in `env` when this is an srun task that has none of
    them; the names filled (none when not under srun, turned off, or already set)."""
    if env.get(ENV_SLURM_ENV) == "0" or not in_slurm_step(env):
        return ()
    if "RANK" in env or "WORLD_SIZE" in env:
        return ()  # torchrun's worker, a wrapper that mapped them, or a previous process of ours
    try:
        mapped = torch_env_from_slurm(env)
    except SlurmEnvError as exc:
        warn(f"Slurm's variables were not translated: {exc}")
        return ()
    filled = tuple(name for name in SLURM_FILLED if name in mapped and name not in env)
    for name in filled:
        env[name] = mapped[name]
    if filled:
        env[ENV_FILLED_FROM] = "slurm"
        env[ENV_FILLED] = ",".join(filled)
    return filled


def on_startup(
    env: MutableMapping[str, str] | None = None, orig_argv: Sequence[str] | None = None
) -> bool:
    """Called by the sitecustomize; True when this process waits to become a rank."""
    env = os.environ if env is None else env
    argv = list(getattr(sys, "orig_argv", sys.argv) if orig_argv is None else orig_argv)
    if not env.get(ENV_RUN_DIR) or env.get(ENV_AUTOSTART) == "0" or is_launcher(argv):
        return False
    fill_from_slurm(env)
    _guard_output(env)
    when_imported(WATCHED_MODULE, wrap_init_process_group)
    when_imported(TORCHFT_MANAGER, _wrap_torchft_manager)  # a torchft Manager makes a rank too
    when_imported(TORCHFT_PROCESS_GROUP, _wrap_torchft_groups)
    if ray_worker.is_ray_worker(argv):
        ray_worker.install()  # its calls are the user's code: Ray ends the worker after them
    run_dir = env.get(ENV_RUN_DIR)
    if run_dir:
        atexit.register(_say_if_never_joined, run_dir)
    return True


def _wrap_torchft_manager(module: Any) -> None:
    from ddpdoctor.runtime import torchft_hooks

    torchft_hooks.wrap_manager(module, start=_start_runtime, on_join=_mark_joined)


def _wrap_torchft_groups(module: Any) -> None:
    from ddpdoctor.runtime import torchft_hooks

    torchft_hooks.wrap_process_groups(module)


def _guard_output(env: Mapping[str, str]) -> None:
    """From the first line on, before the process may become a rank: a print() of the job must
    not fail because its output file in the run directory has no room (runtime/output_guard)."""
    try:
        from ddpdoctor.runtime import output_guard

        local = env.get("LOCAL_RANK", "")
        output_guard.install(Path(env[ENV_RUN_DIR]), int(local) if local.isdigit() else None)
    except Exception:  # noqa: BLE001 - the job's output as it was is better than no job
        pass


# Set once this process has joined a process group (it is a rank, and its events say the rest).
_joined = False


def _mark_joined() -> None:
    global _joined
    _joined = True


def _say_if_never_joined(run_dir: str) -> None:
    """At exit: a process that never joined leaves one line in RUN_DIR/processes.jsonl, so a job
    none of whose processes joined reads as that, not as one that never started."""
    if _joined:
        return
    processes.append(
        run_dir,
        {"argv": list(getattr(sys, "argv", []) or []), "joined": False,
         "error": processes.exception_text(), "engines": processes.engines_loaded()},
    )  # fmt: skip


# -- the rank joins -------------------------------------------------------------------------

JOIN_MARK = "__ddpdoctor_join__"


def wrap_init_process_group(dist: Any) -> None:
    """Start the runtime when this process joins a process group (once per process)."""
    c10d = getattr(dist, "distributed_c10d", None)
    original = getattr(c10d, "init_process_group", None) or getattr(
        dist, "init_process_group", None
    )
    if original is None or getattr(original, JOIN_MARK, False):
        return
    from ddpdoctor.runtime import c10d_hooks, core

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        runtime = core.active() or _start_runtime()
        c10d_hooks.forget_calls()
        result = original(*args, **kwargs)
        _mark_joined()
        current = core.active()
        if current is not None and current is runtime:
            current.on_process_group()
        return result

    setattr(init_process_group, JOIN_MARK, True)
    # the runtime's own lifecycle wrapper must not wrap this one again
    setattr(init_process_group, c10d_hooks.WRAPPED_MARK, original)
    for module in (c10d, dist):
        if module is not None and getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group


def _start_runtime() -> Any:
    from ddpdoctor.runtime import activation

    return activation.start(join_only=True, script=_script_label())


def _script_label() -> str | None:
    argv = list(getattr(sys, "argv", []) or [])
    return argv[0] if argv and argv[0] not in ("-c", "") else None
