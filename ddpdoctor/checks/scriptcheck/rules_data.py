"""Data rules: the DistributedSampler's epoch, shuffle next to a sampler, downloads by every rank."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.guards import maybe_rank_guarded
from ddpdoctor.checks.scriptcheck.rulebase import finding, is_distributed, rule
from ddpdoctor.checks.scriptcheck.scopes import (
    ModuleIndex,
    Project,
    constant,
    is_dist,
    kwarg,
    leaf,
    target_key,
    walk_scope,
)
from ddpdoctor.findings import Severity

SET_EPOCH = "script.set_epoch_missing"
SHUFFLE = "script.shuffle_with_sampler"
DOWNLOAD = "script.download_every_rank"


@rule(SHUFFLE, Severity.ERROR, "`DataLoader(shuffle=True, sampler=...)`")
def shuffle_with_sampler(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if leaf(name) != "DataLoader" or constant(kwarg(call, "shuffle")) is not True:
            continue
        for option in ("sampler", "batch_sampler"):
            given = kwarg(call, option)
            if given is not None and constant(given) is not None:
                yield finding(
                    SHUFFLE,
                    Severity.ERROR,
                    module,
                    call,
                    f"DataLoader gets shuffle=True together with {option}=",
                    why="DataLoader raises ValueError at start: the sampler option is mutually "
                    "exclusive with shuffle",
                    fix="drop shuffle=True from the DataLoader; the DistributedSampler shuffles "
                    "(shuffle=True is its default)",
                )
                break


def _sampler_call(expr: ast.expr, module: ModuleIndex, scope: ast.AST) -> ast.Call | None:
    """The `DistributedSampler(...)` call that `expr` is, or that the name `expr` was bound to."""
    if isinstance(expr, ast.Call) and leaf(module.qualname(expr.func)) == "DistributedSampler":
        return expr
    key = target_key(expr)
    if key is None:
        return None
    values = module.assignments(scope).get(key, ())
    if len(values) != 1:
        return None
    return (
        _sampler_call(values[0][1], module, scope) if isinstance(values[0][1], ast.Call) else None
    )


def _iterates(loop: ast.AST, key: str) -> bool:
    """`for b in loader`, `for i, b in enumerate(loader)`, `for b in tqdm(loader)`."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    source = loop.iter
    if isinstance(source, ast.Call) and source.args:
        source = source.args[0]
    return target_key(source) == key


@rule(SET_EPOCH, Severity.WARNING, "shuffling DistributedSampler without `set_epoch(epoch)`")
def set_epoch_missing(project: Project) -> Iterator[ScriptFinding]:
    # Any set_epoch call anywhere: precision first, we do not try to match it to its sampler.
    if project.calls_any(lambda name: leaf(name) == "set_epoch"):
        return
    for module, call, name in project.all_calls():
        if leaf(name) != "DataLoader":
            continue
        scope = module.scope_of(call)
        given = kwarg(call, "sampler")
        sampler = _sampler_call(given, module, scope) if given is not None else None
        if sampler is None or constant(kwarg(sampler, "shuffle")) is False:
            continue
        parent = module.parents.get(call)
        if not isinstance(parent, ast.Assign) or len(parent.targets) != 1:
            continue
        key = target_key(parent.targets[0])
        if key is None:
            continue
        for loop in walk_scope(scope):
            if not _iterates(loop, key):
                continue
            epoch_loop = next(
                (
                    a
                    for a in module.ancestors(loop)
                    if isinstance(a, (ast.For, ast.AsyncFor, ast.While))
                ),
                None,
            )
            if epoch_loop is None or module.scope_of(epoch_loop) is not scope:
                continue
            yield finding(
                SET_EPOCH,
                Severity.WARNING,
                module,
                epoch_loop,
                f"the DistributedSampler of line {sampler.lineno} shuffles, but "
                "sampler.set_epoch(epoch) is never called in this epoch loop",
                why="the sampler seeds its shuffle with the epoch, so every epoch sees the same "
                "order and the shuffle does nothing after the first",
                fix="call sampler.set_epoch(epoch) at the start of each epoch, before iterating "
                "the DataLoader",
            )
            break


def _has_barrier(module: ModuleIndex, scope: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call) and is_dist(module.qualname(node.func), "barrier")
        for node in walk_scope(scope)
    )


@rule(DOWNLOAD, Severity.WARNING, "data set `download=True` on every rank")
def download_every_rank(project: Project) -> Iterator[ScriptFinding]:
    if not is_distributed(project):
        return
    for module, call, _name in project.all_calls():
        if constant(kwarg(call, "download")) is not True:
            continue
        if _has_barrier(module, module.scope_of(call)) or maybe_rank_guarded(call, module, project):
            continue
        yield finding(
            DOWNLOAD,
            Severity.WARNING,
            module,
            call,
            "every rank downloads the data set (download=True, no rank-0 download behind a barrier)",
            why="the ranks write the same files at once: corrupt archives, 'File is not a zip "
            "file' or checksum errors, and N times the traffic",
            fix="download on rank 0 only (if rank == 0: Dataset(download=True)), then "
            "dist.barrier(), then build the data set with download=False on every rank",
        )
