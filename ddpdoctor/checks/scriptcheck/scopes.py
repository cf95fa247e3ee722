"""What a name or a call refers to: import aliases, parents, enclosing functions and assignments.

One `ModuleIndex` per file is built with a single walk of the tree, so that every rule asks cheap
questions (all the calls, the parent of a node, where a name was assigned) instead of walking again.
A `Project` holds the indexes of a script and its local modules, and finds a function's call sites
across them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddpdoctor.checks.scriptcheck.source import SourceFile

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef | ast.Module
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass
class ModuleIndex:
    source: SourceFile
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> dotted import path
    calls: list[tuple[ast.Call, str]] = field(default_factory=list)  # call, qualified name
    loops: list[ast.For | ast.AsyncFor | ast.While] = field(default_factory=list)
    ifs: list[ast.If] = field(default_factory=list)
    _assigns: dict[ast.AST, dict[str, list[tuple[int, ast.expr]]]] = field(default_factory=dict)

    @classmethod
    def build(cls, source: SourceFile) -> ModuleIndex:
        index = cls(source)
        for node in ast.walk(source.tree):
            for child in ast.iter_child_nodes(node):
                index.parents[child] = node
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        index.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".", 1)[0]
                        index.aliases.setdefault(top, top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    index.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                index.loops.append(node)
            elif isinstance(node, ast.If):
                index.ifs.append(node)
        # Qualified names need every alias, so calls are named after the walk.
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Call):
                index.calls.append((node, index.qualname(node.func)))
        index.calls.sort(key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        return index

    @property
    def path(self) -> str:
        return self.source.path

    def qualname(self, expr: ast.expr) -> str:
        """`dist.barrier` -> "torch.distributed.barrier"; "" when it is not a dotted name."""
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            parts.append(self.aliases.get(expr.id, expr.id))
        elif isinstance(expr, ast.Call):  # ToyModel().to -> "ToyModel().to"
            inner = self.qualname(expr.func)
            if not inner:
                return ""
            parts.append(inner + "()")
        else:
            return ""
        return ".".join(reversed(parts))

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def scope_of(self, node: ast.AST) -> Scope:
        """The function (or class body, or module) whose code `node` is part of."""
        for parent in self.ancestors(node):
            if isinstance(parent, (*FUNCTIONS, ast.ClassDef, ast.Module)):
                return parent
        return self.source.tree

    def class_of(self, node: ast.AST) -> ast.ClassDef | None:
        for parent in self.ancestors(node):
            if isinstance(parent, ast.ClassDef):
                return parent
        return None

    def assignments(self, scope: ast.AST) -> dict[str, list[tuple[int, ast.expr]]]:
        """Names (and `self.x`) assigned directly in `scope`: key -> [(line, value)], in order."""
        cached = self._assigns.get(scope)
        if cached is not None:
            return cached
        found: dict[str, list[tuple[int, ast.expr]]] = {}
        for node in walk_scope(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    _record(found, target, node.value, node.lineno)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                _record(found, node.target, node.value, node.lineno)
        self._assigns[scope] = found
        return found

    def class_assignments(self, cls: ast.ClassDef, key: str) -> list[tuple[ast.AST, ast.expr]]:
        """`self.x = value` in any method of `cls`: [(method, value)]."""
        found: list[tuple[ast.AST, ast.expr]] = []
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.extend((item, value) for _, value in self.assignments(item).get(key, ()))
        return found


def _record(
    found: dict[str, list[tuple[int, ast.expr]]], target: ast.expr, value: ast.expr, line: int
) -> None:
    key = target_key(target)
    if key is not None:
        found.setdefault(key, []).append((line, value))
    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
        for sub_target, sub_value in zip(target.elts, value.elts, strict=False):
            _record(found, sub_target, sub_value, line)


def _module_function(call: ast.Call, module: ModuleIndex) -> bool:
    """`torch.save(...)`, `os.path.join(...)`: a function of an imported module, not of the script."""
    root = call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    return root is not call.func and isinstance(root, ast.Name) and root.id in module.aliases


def target_key(expr: ast.expr) -> str | None:
    """ "x" for a name, "self.x" for an attribute of a name; None for anything else."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    return None


def walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`'s own code, not those of the functions and classes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (*FUNCTIONS, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_dist(name: str, *leaves: str) -> bool:
    """A torch.distributed function (however imported) whose last name is one of `leaves`."""
    return name.startswith("torch.distributed.") and leaf(name) in leaves


def is_ddp(name: str) -> bool:
    return leaf(name) == "DistributedDataParallel"


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def constant(expr: ast.expr | None) -> object:
    """The value of a literal (a negative number too); a sentinel for anything else."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        inner = constant(expr.operand)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner
    return NOT_CONSTANT


NOT_CONSTANT = object()


@dataclass
class Project:
    """A script and the local modules it imports."""

    modules: list[ModuleIndex]
    _sites: dict[str, list[tuple[ModuleIndex, ast.Call]]] | None = None

    def all_calls(self) -> Iterator[tuple[ModuleIndex, ast.Call, str]]:
        for module in self.modules:
            for call, name in module.calls:
                yield module, call, name

    def call_sites(self, function_name: str) -> list[tuple[ModuleIndex, ast.Call]]:
        """Calls of `f(...)` or `x.f(...)` anywhere in the project."""
        if self._sites is None:
            self._sites = {}
            for module, call, name in self.all_calls():
                if name and not _module_function(call, module):
                    self._sites.setdefault(leaf(name), []).append((module, call))
        return self._sites.get(function_name, [])

    def calls_any(self, predicate) -> bool:
        return any(predicate(name) for _, _, name in self.all_calls())
