"""FSDP2 and DeviceMesh: what every rank must do alike, done on some ranks only.

`fully_shard` decides which all-gathers and reduce-scatters a rank makes, `requires_grad_`
which gradients it reduces, and a full state dict (DTensor's `full_tensor()`, torch's
`get_model_state_dict` / `get_optimizer_state_dict` / `get_state_dict`, a DCP save) gathers
every shard from every rank. Under `if rank == 0:` (or on any rank-dependent path) the ranks
then make different collectives: gloo aborts on a size check, NCCL hangs. Precision first: a
strict rank guard (the rank provably from `dist.get_rank()`, `RANK`, ...) is an error; a test
that merely looks rank-related (`if is_main:`) a warning.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.guards import maybe_rank_guarded, rank_zero_guard
from ddpdoctor.checks.scriptcheck.rulebase import finding, rule
from ddpdoctor.checks.scriptcheck.rules_collectives import body_lines
from ddpdoctor.checks.scriptcheck.scopes import FUNCTIONS, ModuleIndex, Project, leaf
from ddpdoctor.findings import Severity

WRAP = "script.fully_shard_rank_dependent"
FREEZE = "script.requires_grad_rank_dependent"
GATHER = "script.full_state_dict_rank_zero"
GATHERS = frozenset(
    {"get_model_state_dict", "get_optimizer_state_dict", "get_state_dict", "full_tensor"}
)
DCP_SAVES = frozenset({"save", "async_save", "save_state_dict"})


def _where(
    node: ast.AST, module: ModuleIndex, project: Project
) -> tuple[str, Severity, tuple[int, int] | None] | None:
    """How sure it is that `node` runs on some ranks only: under a provable rank guard (error),
    or on a path that looks rank-dependent (warning); None when every rank runs it."""
    guard = rank_zero_guard(node, module)
    if guard is not None:
        return f"under the rank guard of line {guard.lineno}", Severity.ERROR, body_lines(guard)
    if _in_rankish_branch(node, module, project):
        return "on a rank-dependent path", Severity.WARNING, None
    return None


def _in_rankish_branch(node: ast.AST, module: ModuleIndex, project: Project) -> bool:
    """A rank-related `if` of the same function around `node` (not the function's callers: a
    model-building function called under `if rank == 0:` for an unwrapped copy is common)."""
    for parent in module.ancestors(node):
        if isinstance(parent, (*FUNCTIONS, ast.ClassDef)):
            return False
        if isinstance(parent, ast.If | ast.IfExp):
            return maybe_rank_guarded(node, module, project)
    return False


def _is_fully_shard(name: str) -> bool:
    return leaf(name) == "fully_shard" and (
        name.startswith("torch.distributed") or name == "fully_shard"
    )


def _method(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else ""


@rule(WRAP, Severity.ERROR, "`fully_shard` called on some ranks only (under a rank guard)")
def fully_shard_rank_dependent(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if not _is_fully_shard(name):
            continue
        where = _where(call, module, project)
        if where is None:
            continue
        text, severity, block = where
        yield finding(
            WRAP,
            severity,
            module,
            call,
            f"fully_shard() runs {text}",
            why="each fully_shard makes a unit whose parameters every rank all-gathers and "
            "reduce-scatters together; a rank with other units makes other collectives, and the "
            "job aborts (gloo) or hangs (NCCL) at the first forward",
            fix="wrap the same modules on every rank, in the same order; decide what to wrap "
            "from the model, never from the rank",
            block=block,
        )


@rule(FREEZE, Severity.ERROR, "`requires_grad_` / `requires_grad =` changed on some ranks only")
def requires_grad_rank_dependent(project: Project) -> Iterator[ScriptFinding]:
    if not project.calls_any(lambda n: _is_fully_shard(n) or "DistributedDataParallel" in n):
        return
    for module in project.modules:
        nodes: list[ast.AST] = [
            call for call, _ in module.calls if _method(call) == "requires_grad_"
        ]
        nodes += [
            node
            for node in ast.walk(module.source.tree)
            if isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in node.targets
            )
        ]
        for node in sorted(nodes, key=lambda n: getattr(n, "lineno", 0)):
            where = _where(node, module, project)
            if where is None:
                continue
            text, severity, block = where
            yield finding(
                FREEZE,
                severity,
                module,
                node,
                f"requires_grad is changed {text}",
                why="FSDP and DDP reduce the gradients of the parameters that require grad: a "
                "parameter frozen on some ranks only makes their reduce-scatters (all-reduce "
                "buckets) a different size from the others'",
                fix="freeze or unfreeze the same parameters on every rank, before wrapping the "
                "model",
                block=block,
            )


@rule(GATHER, Severity.ERROR, "a full state dict or a DCP save on rank 0 only")
def full_state_dict_rank_zero(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        what = _gather(call, name)
        if what is None:
            continue
        guard = rank_zero_guard(call, module)
        if guard is None:
            continue
        yield finding(
            GATHER,
            Severity.ERROR,
            module,
            call,
            f"{what} runs only under the rank guard of line {guard.lineno}",
            why="with sharded parameters (FSDP2, DTensor) it gathers every shard from every rank: "
            "the others never join, so the job hangs here or pairs it with their next collective",
            fix="call it on every rank (get_model_state_dict(model, options="
            "StateDictOptions(full_state_dict=True, cpu_offload=True)) returns the full dict on "
            "rank 0 only), and keep only torch.save under `if rank == 0:`; dcp.save runs on "
            "every rank",
            block=body_lines(guard),
        )


def _gather(call: ast.Call, name: str) -> str | None:
    method = _method(call)
    if method in GATHERS or leaf(name) in GATHERS:
        return f"{method or leaf(name)}()"
    if leaf(name) in DCP_SAVES and name.startswith("torch.distributed.checkpoint"):
        return f"{name.removeprefix('torch.distributed.checkpoint.')}() (a DCP save)"
    return None
