"""Process-group setup rules: hard-coded rank/world size/port, spawn without a main guard, teardown,
find_unused_parameters."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.rulebase import finding, is_spawn, rule
from ddpdoctor.checks.scriptcheck.scopes import (
    FUNCTIONS,
    ModuleIndex,
    Project,
    constant,
    is_ddp,
    is_dist,
    kwarg,
    leaf,
)
from ddpdoctor.findings import Severity

HARDCODED = "script.init_hardcoded_rank"
PORT = "script.master_port_hardcoded"
TCP = "script.init_method_port_hardcoded"
SPAWN = "script.spawn_without_main_guard"
DESTROY = "script.destroy_missing"
UNUSED = "script.find_unused_parameters"
_TCP_PORT = re.compile(r"^tcp://[^/]*:(\d+)")


@rule(HARDCODED, Severity.WARNING, "`init_process_group` with a literal `world_size`/`rank`")
def init_hardcoded_rank(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if not is_dist(name, "init_process_group"):
            continue
        fixed = [
            f"{arg}={constant(kwarg(call, arg))!r}"
            for arg in ("world_size", "rank")
            if isinstance(constant(kwarg(call, arg)), int) and constant(kwarg(call, arg)) != -1
        ]
        if fixed:
            yield finding(
                HARDCODED,
                Severity.WARNING,
                module,
                call,
                f"init_process_group gets {' and '.join(fixed)} written in the code",
                why="under torchrun (or any other world size) every rank claims the same rank, or "
                "waits for a world that never fills: the rendezvous hangs or fails",
                fix="drop world_size= and rank= and use init_method='env://' (the default): "
                "torchrun sets RANK and WORLD_SIZE for each process",
            )


def _env_subscript(target: ast.expr, module: ModuleIndex) -> str | None:
    if isinstance(target, ast.Subscript) and module.qualname(target.value) == "os.environ":
        value = constant(target.slice)
        return value if isinstance(value, str) else None
    return None


@rule(PORT, Severity.INFO, "a fixed `MASTER_PORT` set in the code")
def master_port_hardcoded(project: Project) -> Iterator[ScriptFinding]:
    for module in project.modules:
        for node in ast.walk(module.source.tree):
            if not isinstance(node, ast.Assign) or isinstance(constant(node.value), type(None)):
                continue
            if isinstance(constant(node.value), (str, int)) and any(
                _env_subscript(t, module) == "MASTER_PORT" for t in node.targets
            ):
                yield finding(
                    PORT,
                    Severity.INFO,
                    module,
                    node,
                    f"MASTER_PORT is fixed to {constant(node.value)!r} in the code",
                    why="a second job on the same host fails with 'Address already in use'; "
                    "under torchrun it overrides the port torchrun chose",
                    fix='os.environ.setdefault("MASTER_PORT", "29500"), or leave it to the '
                    "launcher (torchrun --master-port / --rdzv-endpoint)",
                )


@rule(TCP, Severity.WARNING, "`init_method='tcp://host:PORT'` with the port in the code")
def init_method_port_hardcoded(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if not is_dist(name, "init_process_group"):
            continue
        url = constant(kwarg(call, "init_method"))
        match = _TCP_PORT.match(url) if isinstance(url, str) else None
        if match:
            yield finding(
                TCP,
                Severity.WARNING,
                module,
                call,
                f"init_method={url!r} fixes the rendezvous port {match.group(1)} in the code",
                why="a second job on the same host fails with 'Address already in use', and the "
                "launcher's MASTER_ADDR/MASTER_PORT are ignored",
                fix="use init_method='env://' (the default) and pass the address to the launcher",
            )


def _main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(constant(c) == "__main__" for c in test.comparators)
    )


def _top_level_unguarded(module: ModuleIndex) -> Iterator[ast.stmt]:
    """Statements that run on import: module level, not under `if __name__ == "__main__":`."""
    stack = list(module.source.tree.body)
    while stack:
        statement = stack.pop()
        if isinstance(statement, (*FUNCTIONS, ast.ClassDef)):
            continue
        if isinstance(statement, ast.If):
            if not _main_guard(statement.test):
                stack.extend(statement.body)
            stack.extend(statement.orelse)
            continue
        if isinstance(statement, (ast.Try, ast.With, ast.For, ast.While)):
            stack.extend(getattr(statement, "body", []))
        yield statement


@rule(SPAWN, Severity.ERROR, '`mp.spawn` without the `if __name__ == "__main__":` guard')
def spawn_without_main_guard(project: Project) -> Iterator[ScriptFinding]:
    module = project.modules[0]  # only the script runs as __main__
    spawners = {
        f.name
        for f in ast.walk(module.source.tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(isinstance(c, ast.Call) and is_spawn(module.qualname(c.func)) for c in ast.walk(f))
    }
    for statement in _top_level_unguarded(module):
        for node in ast.walk(statement):
            if not isinstance(node, ast.Call):
                continue
            name = module.qualname(node.func)
            if is_spawn(name) or name in spawners:
                yield finding(
                    SPAWN,
                    Severity.ERROR,
                    module,
                    node,
                    f'{leaf(name)}() runs at import time, outside if __name__ == "__main__":',
                    why="spawned workers re-import the script, reach the spawn again and fail "
                    "with 'An attempt has been made to start a new process before the current "
                    "process has finished its bootstrapping phase'",
                    fix='move the call under if __name__ == "__main__":',
                )
                break


@rule(DESTROY, Severity.WARNING, "no `destroy_process_group()` at the end")
def destroy_missing(project: Project) -> Iterator[ScriptFinding]:
    if project.calls_any(lambda name: is_dist(name, "destroy_process_group")):
        return
    for module, call, name in project.all_calls():
        if is_dist(name, "init_process_group"):
            yield finding(
                DESTROY,
                Severity.WARNING,
                module,
                call,
                "the process group is never destroyed",
                why="at exit the backend is torn down while peers may still talk to it: NCCL "
                "warns 'process group has NOT been destroyed', and exits can hang or leak",
                fix="call dist.destroy_process_group() at the end of training (in a finally:)",
            )
            return


@rule(UNUSED, Severity.INFO, "`find_unused_parameters=True`")
def find_unused_parameters(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if is_ddp(name) and constant(kwarg(call, "find_unused_parameters")) is True:
            yield finding(
                UNUSED,
                Severity.INFO,
                module,
                call,
                "DDP searches for unused parameters after every forward",
                why="the extra traversal of the autograd graph slows every step; it is needed "
                "only when some parameters get no gradient in an iteration",
                fix="drop find_unused_parameters=True unless DDP reports unused parameters "
                "without it",
            )
