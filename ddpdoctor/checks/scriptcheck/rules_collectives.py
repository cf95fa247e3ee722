"""A collective, a barrier or a DDP forward that only rank 0 reaches: the other ranks never join it."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.frameworks import framework_collective, zero_only_function
from ddpdoctor.checks.scriptcheck.guards import rank_zero_guard
from ddpdoctor.checks.scriptcheck.rulebase import finding, rule
from ddpdoctor.checks.scriptcheck.scopes import (
    ModuleIndex,
    Project,
    is_ddp,
    is_dist,
    kwarg,
    target_key,
)
from ddpdoctor.findings import Severity

RANK_GUARD = "script.collective_under_rank_guard"
COLLECTIVES = (
    "barrier", "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list", "monitored_barrier", "new_group",
)  # fmt: skip
_FIX = (
    "call it on every rank, outside the `if rank == 0:` (keep only the printing or saving under "
    "the guard)"
)


def _ddp_keys(module: ModuleIndex, call: ast.Call) -> set[str]:
    """Names (and self.attributes) bound to a DDP(...) in the call's function or class."""
    keys: set[str] = set()
    scope = module.scope_of(call)
    for key, values in module.assignments(scope).items():
        if any(isinstance(v, ast.Call) and is_ddp(module.qualname(v.func)) for _, v in values):
            keys.add(key)
    cls = module.class_of(call)
    if cls is not None:
        attr = target_key(call.func)
        if (
            attr is not None
            and attr.startswith("self.")
            and any(
                isinstance(v, ast.Call) and is_ddp(module.qualname(v.func))
                for _, v in module.class_assignments(cls, attr)
            )
        ):
            keys.add(attr)
    return keys


def body_lines(guard: ast.If) -> tuple[int, int]:
    """First and last line of the guard's body (not its else)."""
    last = guard.body[-1]
    return guard.body[0].lineno, getattr(last, "end_lineno", None) or last.lineno


@rule(
    RANK_GUARD,
    Severity.ERROR,
    "a collective, `dist.barrier()` or a DDP forward only under `if rank == 0:`",
)
def collective_under_rank_guard(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        what = framework_collective(call, name, module)
        if what is not None:
            found = _framework_finding(module, call, what)
            if found is not None:
                yield found
            continue
        if is_dist(name, *COLLECTIVES):
            if kwarg(call, "group") is not None:  # a subgroup may hold rank 0 alone
                continue
            guarded = _guard_of(call, module)
            if guarded is None:
                continue
            where, block = guarded
            yield finding(
                RANK_GUARD,
                Severity.ERROR,
                module,
                call,
                f"{name.rsplit('.', 1)[-1]}() runs only {where}",
                why="a collective needs every rank; the others never reach it, so the job hangs "
                "at this line until the NCCL/gloo timeout",
                fix=_FIX,
                block=block,
            )
            continue
        key = target_key(call.func)
        if key is None or key not in _ddp_keys(module, call):
            continue
        guard = rank_zero_guard(call, module)
        if guard is not None:
            yield finding(
                RANK_GUARD,
                Severity.WARNING,
                module,
                call,
                f"the DDP model's forward runs only under the rank guard of line {guard.lineno}",
                why="DDP's forward broadcasts buffers and its backward all-reduces gradients with "
                "every rank; with rank 0 alone the job hangs here",
                fix="evaluate on every rank, or use the unwrapped model (ddp_model.module) under "
                "the guard",
                block=body_lines(guard),
            )


_FRAMEWORK_FIX = "call it on every rank, outside the rank guard"
_LOG_FIX = (
    " (a metric logged from rank 0 alone takes self.log(..., rank_zero_only=True), without "
    "sync_dist)"
)


def _framework_finding(module: ModuleIndex, call: ast.Call, what: str) -> ScriptFinding | None:
    """A framework's collective (`self.log(..., sync_dist=True)`, `accelerator.gather()`, ...)
    under a rank-0 test or in a `@rank_zero_only` function."""
    guarded = _guard_of(call, module)
    if guarded is None:
        return None
    where, block = guarded
    return finding(
        RANK_GUARD,
        Severity.ERROR,
        module,
        call,
        f"{what} runs only {where}",
        why="it is a collective (the framework synchronizes it across ranks): the other ranks "
        "never reach it, so the job hangs here or pairs it with another collective",
        fix=_FRAMEWORK_FIX + (_LOG_FIX if ".log" in what else ""),
        block=block,
    )


def _guard_of(call: ast.Call, module: ModuleIndex) -> tuple[str, tuple[int, int] | None] | None:
    """("under the rank guard of line N", its body) or ("in a rank-zero-only function (line
    N)", None) for a call that runs on some ranks only; None when every rank runs it."""
    guard = rank_zero_guard(call, module)
    if guard is not None:
        return f"under the rank guard of line {guard.lineno}", body_lines(guard)
    function = zero_only_function(call, module)
    if function is not None:
        return f"in a rank-zero-only function (line {getattr(function, 'lineno', 0)})", None
    return None
