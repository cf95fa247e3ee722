"""A collective, a barrier or a DDP forward that only rank 0 reaches: the other ranks never join it."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
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
        if is_dist(name, *COLLECTIVES):
            if kwarg(call, "group") is not None:  # a subgroup may hold rank 0 alone
                continue
            guard = rank_zero_guard(call, module)
            if guard is None:
                continue
            yield finding(
                RANK_GUARD,
                Severity.ERROR,
                module,
                call,
                f"{name.rsplit('.', 1)[-1]}() runs only under the rank guard of line {guard.lineno}",
                why="a collective needs every rank; the others never reach it, so the job hangs "
                "at this line until the NCCL/gloo timeout",
                fix=_FIX,
                block=body_lines(guard),
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
