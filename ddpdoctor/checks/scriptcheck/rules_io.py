"""Output rules: checkpoints every rank writes to one path, prints from every rank."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.guards import _RANKISH, maybe_rank_guarded
from ddpdoctor.checks.scriptcheck.rulebase import finding, is_distributed, rule
from ddpdoctor.checks.scriptcheck.scopes import ModuleIndex, Project, constant, leaf, target_key
from ddpdoctor.findings import Severity

SAVE = "script.checkpoint_every_rank"
PRINT = "script.print_every_rank"
_LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "critical", "exception")


def _same_path_everywhere(
    expr: ast.expr, module: ModuleIndex, scope: ast.AST, depth: int = 0
) -> bool:
    """A path that is the same on every rank: a literal, or an f-string that names no rank."""
    if depth > 3:
        return False
    if isinstance(constant(expr), str):
        return True
    if isinstance(expr, ast.JoinedStr):
        return not any(
            isinstance(n, (ast.Name, ast.Attribute))
            and _RANKISH.search(n.id if isinstance(n, ast.Name) else n.attr)
            for n in ast.walk(expr)
        )
    key = target_key(expr)
    if key is None:
        return False
    values = module.assignments(scope).get(key, ())
    return bool(values) and all(
        _same_path_everywhere(v, module, scope, depth + 1) for _, v in values
    )


@rule(SAVE, Severity.WARNING, "a checkpoint saved by every rank to the same path")
def checkpoint_every_rank(project: Project) -> Iterator[ScriptFinding]:
    if not is_distributed(project):
        return
    for module, call, name in project.all_calls():
        if name != "torch.save" or len(call.args) < 2:
            continue
        if not _same_path_everywhere(call.args[1], module, module.scope_of(call)):
            continue
        if maybe_rank_guarded(call, module, project):
            continue
        yield finding(
            SAVE,
            Severity.WARNING,
            module,
            call,
            "every rank saves the checkpoint to the same path",
            why="the ranks write one file at once: a torn or corrupt checkpoint, and N times "
            "the I/O",
            fix="save on rank 0 only: if dist.get_rank() == 0: torch.save(...) (then "
            "dist.barrier() before anyone loads it)",
        )


def _is_output(name: str) -> bool:
    if name == "print":
        return True
    if leaf(name) not in _LOG_LEVELS or "." not in name:
        return False
    owner = name.rsplit(".", 1)[0]
    return owner == "logging" or "log" in leaf(owner).lower()


@rule(PRINT, Severity.INFO, "`print`/logging from every rank")
def print_every_rank(project: Project) -> Iterator[ScriptFinding]:
    if not is_distributed(project):
        return
    for module in project.modules:  # one note per file: the first line, and how many there are
        unguarded = [
            call
            for call, name in module.calls
            if _is_output(name) and not maybe_rank_guarded(call, module, project)
        ]
        if unguarded:
            more = f" (and {len(unguarded) - 1} more)" if len(unguarded) > 1 else ""
            yield finding(
                PRINT,
                Severity.INFO,
                module,
                unguarded[0],
                f"output from every rank{more}",
                why="each line appears once per rank, interleaved; fine for debugging, noisy at "
                "scale",
                fix="print or log on rank 0 only, or prefix lines with the rank",
            )
