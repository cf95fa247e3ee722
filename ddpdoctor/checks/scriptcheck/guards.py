"""Rank provenance and rank guards.

Two strengths, for two kinds of rule:
- `rank_zero_guard` is strict: an `if <rank> == 0:` whose body really encloses the node, where
  `<rank>` provably holds a rank (`dist.get_rank()`, `int(os.environ["RANK"])`, a parameter named
  rank, `self.rank` assigned from one of those...). The hang rule reports only under such a guard.
- `maybe_rank_guarded` is lenient: any enclosing `if` that looks rank-related, or a function called
  only under such guards. Rules that report a statement run by *every* rank (checkpoints, downloads,
  prints) stay quiet when it says yes, so doubt means silence.
"""

from __future__ import annotations

import ast
import re

from ddpdoctor.checks.scriptcheck.frameworks import framework_rank, zero_decorator, zero_flag
from ddpdoctor.checks.scriptcheck.scopes import (
    FUNCTIONS,
    ModuleIndex,
    Project,
    constant,
    is_dist,
    target_key,
)

RANK_PARAMS = frozenset({"rank", "local_rank", "global_rank", "node_rank", "proc_rank"})
RANK_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK"}
)
LOCAL_RANK_ENV = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"})
_RANKISH = re.compile(
    r"rank|main|master|primary|leader|gpu_id|chief|is_zero|local_zero|global_zero|process_zero|"
    r"process_index",
    re.I,
)


def env_key(expr: ast.expr, module: ModuleIndex) -> str | None:
    """ "RANK" for `os.environ["RANK"]`, `os.environ.get("RANK", ...)`, `os.getenv("RANK")`."""
    if isinstance(expr, ast.Subscript) and module.qualname(expr.value) == "os.environ":
        value = constant(expr.slice)
        return value if isinstance(value, str) else None
    if isinstance(expr, ast.Call) and expr.args:
        name = module.qualname(expr.func)
        if name in ("os.environ.get", "os.getenv"):
            value = constant(expr.args[0])
            return value if isinstance(value, str) else None
    return None


def rank_source(
    expr: ast.expr, module: ModuleIndex, *, local_only: bool = False, depth: int = 0
) -> bool:
    """Does `expr` provably hold a rank? With local_only, only a rank within the node counts."""
    if depth > 4:
        return False
    if isinstance(expr, ast.Call):
        name = module.qualname(expr.func)
        if name == "int" and len(expr.args) == 1:
            return rank_source(expr.args[0], module, local_only=local_only, depth=depth + 1)
        if local_only:
            if is_dist(name, "get_node_local_rank"):
                return True
        elif is_dist(name, "get_rank", "get_node_local_rank"):
            return True
    key = env_key(expr, module)
    if key is not None:
        return key in (LOCAL_RANK_ENV if local_only else RANK_ENV)
    if isinstance(expr, ast.Name):
        return _name_is_rank(expr, module, local_only, depth)
    if isinstance(expr, ast.Attribute):
        return _attribute_is_rank(expr, module, local_only, depth)
    return False


def _name_is_rank(expr: ast.Name, module: ModuleIndex, local_only: bool, depth: int) -> bool:
    scope = module.scope_of(expr)
    values = [v for line, v in module.assignments(scope).get(expr.id, ()) if line <= expr.lineno]
    if values:
        return all(rank_source(v, module, local_only=local_only, depth=depth + 1) for v in values)
    if isinstance(scope, FUNCTIONS) and expr.id in _params(scope):
        return expr.id in ({"local_rank"} if local_only else RANK_PARAMS)
    if scope is not module.source.tree:  # a module-level name read inside a function
        values = [v for _, v in module.assignments(module.source.tree).get(expr.id, ())]
        return bool(values) and all(
            rank_source(v, module, local_only=local_only, depth=depth + 1) for v in values
        )
    return False


def _attribute_is_rank(
    expr: ast.Attribute, module: ModuleIndex, local_only: bool, depth: int
) -> bool:
    if not local_only and framework_rank(expr, module):  # self.global_rank, trainer.global_rank
        return True
    key = target_key(expr)
    if key is None:
        return False
    owner = key.split(".", 1)[0]
    if owner == "self":
        cls = module.class_of(expr)
        if cls is None:
            return False
        values = module.class_assignments(cls, key)
        return bool(values) and all(
            rank_source(v, module, local_only=local_only, depth=depth + 1) for _, v in values
        )
    if owner == "args":  # argparse: --local-rank / --rank
        return expr.attr in ({"local_rank"} if local_only else RANK_PARAMS)
    return False


def _params(function: ast.AST) -> set[str]:
    args = function.args  # type: ignore[attr-defined]
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return {a.arg for a in every}


def rank_zero_test(test: ast.expr, module: ModuleIndex) -> bool:
    """`rank == 0`, `0 == rank`, `rank == 3`, `not rank`, a framework's rank-0 flag
    (`self.trainer.is_global_zero`, `accelerator.is_main_process`) or its negation, or an `and`
    with one of those."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(rank_zero_test(value, module) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return rank_source(test.operand, module) or zero_flag(test.operand, module)
    if zero_flag(test, module):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for a, b in ((left, right), (right, left)):
            value = constant(b)
            if isinstance(value, int) and not isinstance(value, bool) and rank_source(a, module):
                return True
    return False


def rank_zero_guard(node: ast.AST, module: ModuleIndex) -> ast.If | None:
    """The `if <rank> == 0:` of the same function whose body encloses `node`, if any."""
    child = node
    for parent in module.ancestors(node):
        if isinstance(parent, (*FUNCTIONS, ast.ClassDef)):
            return None
        if (
            isinstance(parent, ast.If)
            and child in parent.body
            and rank_zero_test(parent.test, module)
        ):
            return parent
        child = parent
    return None


def _looks_rank_related(test: ast.expr, module: ModuleIndex) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and _RANKISH.search(node.id):
            return True
        if isinstance(node, ast.Attribute) and _RANKISH.search(node.attr):
            return True
        if isinstance(node, ast.Call) and rank_source(node, module):
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in RANK_ENV
        ):
            return True
    return False


def maybe_rank_guarded(
    node: ast.AST, module: ModuleIndex, project: Project, depth: int = 0
) -> bool:
    """Could `node` run on some ranks only? Yes when in doubt (see the module docstring)."""
    for parent in module.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and _looks_rank_related(
            parent.test, module
        ):
            return True
        if isinstance(parent, FUNCTIONS):
            if zero_decorator(parent, module) is not None:  # @rank_zero_only
                return True
            if _early_return_for_ranks(parent, node, module):
                return True
            return _only_called_guarded(parent, module, project, depth)
        if isinstance(parent, ast.ClassDef):
            return False
    return False


def _early_return_for_ranks(function: ast.AST, node: ast.AST, module: ModuleIndex) -> bool:
    """`if rank != 0: return` before `node` in the same function."""
    line = getattr(node, "lineno", 0)
    for statement in function.body:  # type: ignore[attr-defined]
        if getattr(statement, "lineno", line) >= line:
            break
        if (
            isinstance(statement, ast.If)
            and _looks_rank_related(statement.test, module)
            and any(isinstance(s, (ast.Return, ast.Raise)) for s in statement.body)
        ):
            return True
    return False


def _only_called_guarded(
    function: ast.AST, module: ModuleIndex, project: Project, depth: int
) -> bool:
    if isinstance(function, ast.Lambda) or depth > 3:
        return False
    sites = project.call_sites(function.name)  # type: ignore[attr-defined]
    if not sites:
        return False
    return all(maybe_rank_guarded(call, owner, project, depth + 1) for owner, call in sites)
