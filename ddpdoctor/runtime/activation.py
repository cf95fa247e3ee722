"""Turning the runtime on in a rank (and off again, for tests).

`activate()` installs everything in this order: exit and exception hooks first (so a failure in
what follows is still recorded), then the torch hooks (collectives, DDP, data), the SIGTERM guard,
the fork guard, the permission for py-spy to attach (ptrace.py), the `hello` event, and last the
heartbeat thread.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ddpdoctor.protocol.events import WARNING
from ddpdoctor.protocol.rundir import ENV_RUN_DIR, make_private_dirs
from ddpdoctor.runtime import core, exit_hooks, output_guard, ptrace
from ddpdoctor.runtime.heartbeat import Heartbeat
from ddpdoctor.runtime.info import env_int
from ddpdoctor.runtime.signals import SigtermGuard

ENV_HEARTBEAT_S = "DDPDOCTOR_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 1.0

_guard: SigtermGuard | None = None
_fork_hook_registered = False


def heartbeat_period() -> float:
    """$DDPDOCTOR_HEARTBEAT_S in seconds (a positive number), else 1.0."""
    try:
        value = float(os.environ.get(ENV_HEARTBEAT_S, ""))
    except ValueError:
        return DEFAULT_HEARTBEAT_S
    return value if value > 0 else DEFAULT_HEARTBEAT_S


def activate(run_dir: str | os.PathLike[str] | None = None) -> core.Runtime | None:
    """Record this process into RUN_DIR/events/rank-<R>.jsonl; idempotent.

    `run_dir` defaults to $DDPDOCTOR_RUN_DIR; with neither, nothing happens and None comes back,
    so an instrumented script runs unchanged under plain torchrun."""
    return start(run_dir)


def start(
    run_dir: str | os.PathLike[str] | None = None,
    *,
    script: str | None = None,
    join_only: bool = False,
) -> core.Runtime | None:
    """activate(), plus what the bootstrap knows: the script it is about to run.

    `join_only` (autostart.py): the process becomes a rank only by joining a process group; its
    rank comes from the group, never from $RANK, and if it never joins it writes nothing."""
    existing = core.active()
    if existing is not None:
        return existing
    target = run_dir if run_dir is not None else os.environ.get(ENV_RUN_DIR)
    if not target:
        return None
    try:
        runtime = core.Runtime(
            Path(target).absolute(),
            rank=None if join_only else env_int("RANK"),
            heartbeat_s=heartbeat_period(),
        )
        runtime.script = script
        runtime.join_only = join_only
        try:
            make_private_dirs(runtime.run_dir.events_dir)
        except OSError:
            pass  # the first write fails and says so, once
        core.set_active(runtime)
        _guard_output(runtime.run_dir.path)
        exit_hooks.install(runtime)
        _install_torch_hooks(runtime)
        _install_process_guards(runtime)
        ptrace.allow_any_tracer()  # py-spy of the same user may attach under ptrace_scope=1
        runtime.say_hello()
        _hello_again_if_initialized(runtime)
        heartbeat = runtime.heartbeat = Heartbeat(runtime)
        heartbeat.start()
        runtime.on_deactivate(heartbeat.stop)
        return runtime
    except Exception as exc:  # noqa: BLE001 - ddpdoctor must never stop the job from starting
        deactivate()
        _stderr_warning(f"event recording is off: {type(exc).__name__}: {exc}")
        return None


def _guard_output(run_dir: Path) -> None:
    """A print() of the job must not fail because ddpdoctor's log file has no room left."""
    try:
        output_guard.install(run_dir, env_int("LOCAL_RANK"))
    except Exception:  # noqa: BLE001 - the job's output as it was is better than no job
        pass


def deactivate() -> None:
    """Take every hook out again and stop the heartbeat (writes no exit event)."""
    runtime = core.active()
    if runtime is None:
        return
    core.set_active(None)
    runtime.uninstall()


def _install_torch_hooks(runtime: core.Runtime) -> None:
    try:
        import torch  # noqa: F401 - the hooks need it; a rank imports it anyway
    except ImportError:
        return
    from ddpdoctor.runtime import (
        c10d_hooks,
        data_hooks,
        ddp_contract,
        ddp_forward,
        ddp_hooks,
        deepspeed_hooks,
        frameworks,
        fsdp_hooks,
        funcol_hooks,
        join_hooks,
        optim_hooks,
        pipeline_hooks,
        replica_sources,
        replicas,
    )

    for name, installer in (
        ("collectives", c10d_hooks.install),
        ("functional collectives", funcol_hooks.install),
        ("ddp", ddp_hooks.install),
        ("ddp contract", ddp_contract.install),
        ("ddp forward", ddp_forward.install),
        ("fsdp", fsdp_hooks.install),
        ("pipelining", pipeline_hooks.install),
        ("data", data_hooks.install),
        ("join", join_hooks.install),
        ("optimizer", optim_hooks.install),
        ("frameworks", frameworks.install),
        ("deepspeed", deepspeed_hooks.install),
        ("replicas", replicas.install),
        ("replicas of HSDP and ZeRO", replica_sources.install),
    ):
        try:
            installer(runtime)
        except Exception as exc:  # noqa: BLE001 - one missing hook must not cost the others
            runtime.emit(
                WARNING,
                code="runtime.hook_failed",
                message=f"ddpdoctor could not hook {name}: {type(exc).__name__}: {exc}",
                details={"hook": name},
            )


def _install_process_guards(runtime: core.Runtime) -> None:
    global _guard, _fork_hook_registered
    guard = SigtermGuard()
    if guard.install(runtime):
        _guard = guard
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_registered = True


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) is not the rank: it must write nothing."""
    runtime = core.active()
    if runtime is not None:
        core.set_active(None)
        runtime.forget_after_fork()
    if _guard is not None:
        _guard.after_fork_in_child()


def _hello_again_if_initialized(runtime: core.Runtime) -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            runtime.on_process_group()
    except Exception:  # noqa: BLE001
        pass


def _stderr_warning(message: str) -> None:
    try:
        sys.stderr.write(f"ddpdoctor: warning: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
