"""What every rule shares: the registry of rule ids, and building a finding at a node.

A rule is a function `(project) -> Iterable[ScriptFinding]` declared with `@rule(id, severity,
what)`; `RULES` keeps them in declaration order, which `check` runs and the README table lists.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.scopes import ModuleIndex, Project, is_ddp, is_dist, leaf
from ddpdoctor.findings import Severity

RuleFunc = Callable[[Project], Iterable[ScriptFinding]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity  # the usual severity; a finding may be milder where the source is less sure
    what: str
    func: RuleFunc


RULES: list[Rule] = []


def rule(id: str, severity: Severity, what: str) -> Callable[[RuleFunc], RuleFunc]:
    def register(func: RuleFunc) -> RuleFunc:
        RULES.append(Rule(id, severity, what, func))
        return func

    return register


def finding(
    rule_id: str,
    severity: Severity,
    module: ModuleIndex,
    node: ast.AST,
    summary: str,
    *,
    why: str,
    fix: str,
    block: tuple[int, int] | None = None,
) -> ScriptFinding:
    line = getattr(node, "lineno", 1)
    return ScriptFinding(
        rule=rule_id,
        severity=severity,
        path=module.path,
        line=line,
        summary=summary,
        why=why,
        fix=fix,
        text=module.source.line_text(line),
        block=block,
    )


def is_distributed(project: Project) -> bool:
    """The script sets up DDP (a process group, a DDP wrapper or spawned workers)."""
    return project.calls_any(
        lambda name: is_dist(name, "init_process_group") or is_ddp(name) or is_spawn(name)
    )


def is_spawn(name: str) -> bool:
    return name.startswith("torch.multiprocessing") and leaf(name) in ("spawn", "start_processes")
