"""The checkup's entry point: load each script and its local modules, run every rule, drop the lines
the user silenced, and return the findings sorted by file and line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# The rule modules register themselves on import; the order here is the rules table's order.
from ddpdoctor.checks.scriptcheck import (  # noqa: F401
    rules_collectives,
    rules_data,
    rules_devices,
    rules_fsdp,
    rules_gpu,
    rules_io,
    rules_setup,
)
from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.rulebase import RULES
from ddpdoctor.checks.scriptcheck.scopes import ModuleIndex, Project
from ddpdoctor.checks.scriptcheck.source import ScriptLoadError, SourceFile, load, local_imports
from ddpdoctor.findings import Severity

SYNTAX = "script.syntax_error"
UNREADABLE = "script.unreadable"
MAX_MODULES = 64  # a script's own helpers, not a whole package tree


def check_scripts(paths: Iterable[str], *, no_gpu: bool = False) -> list[ScriptFinding]:
    """Check each script (and the local modules it imports) without running it.

    A file that cannot be read or parsed gives one error finding (`script.unreadable`,
    `script.syntax_error`), never an exception. `no_gpu`: the machine the job will run on has no
    GPU visible (the doctor's GPU facts), so hard-coded NCCL and CUDA are errors (rules_gpu).
    """
    found: dict[tuple[str, str, int], ScriptFinding] = {}
    for path in paths:
        for item in _check_one(str(path), no_gpu=no_gpu):
            found.setdefault((item.rule, item.path, item.line), item)
    return sorted(found.values(), key=lambda f: (f.path, f.line, f.rule))


def _check_one(path: str, *, no_gpu: bool = False) -> list[ScriptFinding]:
    sources, problems = _load_project(path)
    if not sources:
        return problems
    project = Project([ModuleIndex.build(s) for s in sources])
    by_path = {s.path: s for s in sources}
    findings = list(problems)
    rules = [spec.func for spec in RULES]
    if no_gpu:
        rules.append(rules_gpu.gpu_code_without_gpu)
    for func in rules:
        try:
            produced = list(func(project))
        except (RecursionError, ValueError, TypeError, AttributeError, KeyError):
            # A rule that cannot follow odd code reports nothing there: doubt means silence.
            continue
        findings.extend(f for f in produced if not by_path[f.path].ignored(f.line, f.rule))
    return findings


def _load_project(path: str) -> tuple[list[SourceFile], list[ScriptFinding]]:
    """The script first, then the local modules it imports (breadth first, each once)."""
    sources: list[SourceFile] = []
    problems: list[ScriptFinding] = []
    queue, seen = [path], {str(Path(path).resolve())}
    while queue and len(sources) < MAX_MODULES:
        current = queue.pop(0)
        try:
            source = load(current)
        except ScriptLoadError as exc:
            problems.append(_load_problem(exc))
            if current == path:
                return [], problems
            continue
        sources.append(source)
        for imported in local_imports(source):
            key = str(Path(imported).resolve())
            if key not in seen:
                seen.add(key)
                queue.append(imported)
    return sources, problems


def _load_problem(exc: ScriptLoadError) -> ScriptFinding:
    if exc.line is not None:
        return ScriptFinding(
            rule=SYNTAX,
            severity=Severity.ERROR,
            path=exc.path,
            line=exc.line,
            summary=str(exc),
            why="Python stops before the first line runs; every rank fails at start",
            fix="fix the syntax error (python -m py_compile FILE shows it)",
        )
    return ScriptFinding(
        rule=UNREADABLE,
        severity=Severity.ERROR,
        path=exc.path,
        line=0,
        summary=str(exc),
        why="the script cannot be checked, and the launcher will not be able to run it either",
        fix="check the path and the file's permissions and encoding",
    )
