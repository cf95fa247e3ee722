"""What Lightning, Fabric, accelerate and the HF Trainer call a rank, a rank-0 test and a collective.

A training framework hides torch.distributed behind its own names: the rank is
`self.global_rank` in a LightningModule, `trainer.global_rank`, `accelerator.process_index`; the
rank-0 test is `self.trainer.is_global_zero`, `accelerator.is_main_process`, or a function
decorated `@rank_zero_only`; and collectives hide in `self.log(..., sync_dist=True)`,
`self.all_gather`, `trainer.strategy.barrier()`, `accelerator.gather()` and
`accelerator.wait_for_everyone()`. The script checkup's rank-guard rules ask here, so that a
`self.log(..., sync_dist=True)` under `if self.global_rank == 0:` is the same error as a
`dist.all_reduce` under `if rank == 0:`.

Receivers are recognised by what the frameworks' docs name them (`self` in a LightningModule,
`trainer`, `fabric`, `accelerator`, `self.accelerator`, `state`) or by assignment from the
framework's class (`acc = Accelerator()`); a name that could be anything is not a framework's.
"""

from __future__ import annotations

import ast

from ddpdoctor.checks.scriptcheck.scopes import FUNCTIONS, ModuleIndex, constant, kwarg, leaf

FRAMEWORK_MODULES = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate")
# Attributes that hold the global (or local) rank, per receiver kind.
_RANK_ATTRS = {
    "lightning": frozenset({"global_rank", "local_rank", "node_rank"}),
    "accelerate": frozenset({"process_index", "local_process_index"}),
}
# Attributes (or methods) true on rank 0 (or the node's first rank) only.
_ZERO_FLAGS = {
    "lightning": frozenset({"is_global_zero"}),
    "accelerate": frozenset({"is_main_process", "is_local_main_process"}),
    "hf_trainer": frozenset({"is_world_process_zero", "is_local_process_zero"}),
}
# Methods that are collectives, per receiver kind.
_COLLECTIVES = {
    "lightning": frozenset({"all_gather", "barrier", "broadcast", "all_reduce"}),
    "strategy": frozenset(
        {"barrier", "reduce", "broadcast", "all_gather", "reduce_boolean_decision"}
    ),
    "accelerate": frozenset(
        {
            "gather",
            "gather_for_metrics",
            "reduce",
            "wait_for_everyone",
            "pad_across_processes",
        }
    ),
}
_ACCELERATE_FUNCTIONS = frozenset(
    {"gather", "gather_object", "reduce", "broadcast", "broadcast_object_list", "wait_for_everyone"}
)
_ZERO_DECORATORS = frozenset({"rank_zero_only", "on_main_process", "on_local_main_process"})
_CLASS_NAMES = {
    "accelerate": ("Accelerator", "PartialState", "AcceleratorState"),
    "lightning": ("Trainer", "Fabric"),
}


def uses_framework(module: ModuleIndex) -> bool:
    return any(path.split(".", 1)[0] in FRAMEWORK_MODULES for path in module.aliases.values())


def receiver_kind(expr: ast.expr, module: ModuleIndex) -> str | None:
    """ "lightning" (a LightningModule's self, a Trainer, a Fabric), "strategy", "accelerate"
    (an Accelerator or its state), "hf_trainer"; None for anything else."""
    if not uses_framework(module) and not _imports(module, "transformers"):
        return None
    if isinstance(expr, ast.Attribute) and expr.attr == "strategy":
        return "strategy"
    name = expr.id if isinstance(expr, ast.Name) else None
    attr = expr.attr if isinstance(expr, ast.Attribute) else None
    last = (name or attr or "").lower()
    if name == "self":
        return "lightning" if _lightning_class(expr, module) else None
    if "accelerator" in last or last in ("state", "partial_state"):
        return "accelerate" if _imports(module, "accelerate") else None
    if last in ("trainer", "fabric", "pl_trainer"):
        if _imports(module, "transformers") and not uses_framework(module):
            return "hf_trainer"
        return "lightning"
    if isinstance(expr, ast.Name):
        return _assigned_kind(expr, module)
    return None


def _imports(module: ModuleIndex, top: str) -> bool:
    return any(path.split(".", 1)[0] == top for path in module.aliases.values())


def _lightning_class(expr: ast.expr, module: ModuleIndex) -> bool:
    cls = module.class_of(expr)
    if cls is None or not _imports_lightning(module):
        return False
    return any(
        "Lightning" in name or "Callback" in name
        for name in (module.qualname(base) for base in cls.bases)
    )


def _imports_lightning(module: ModuleIndex) -> bool:
    return any(_imports(module, top) for top in ("lightning", "pytorch_lightning"))


def _assigned_kind(expr: ast.Name, module: ModuleIndex) -> str | None:
    """`acc = Accelerator()`, `fabric = L.Fabric(...)`: the kind of the class it was made from."""
    scope = module.scope_of(expr)
    values = [v for _, v in module.assignments(scope).get(expr.id, ())]
    values += [v for _, v in module.assignments(module.source.tree).get(expr.id, ())]
    for value in values:
        if isinstance(value, ast.Call):
            made = leaf(module.qualname(value.func))
            for kind, classes in _CLASS_NAMES.items():
                if made in classes:
                    return kind
    return None


def framework_rank(expr: ast.expr, module: ModuleIndex) -> bool:
    """`self.global_rank`, `trainer.global_rank`, `accelerator.process_index`, ..."""
    if not isinstance(expr, ast.Attribute):
        return False
    kind = receiver_kind(expr.value, module)
    return kind is not None and expr.attr in _RANK_ATTRS.get(kind, ())


def zero_flag(expr: ast.expr, module: ModuleIndex) -> bool:
    """`self.trainer.is_global_zero`, `accelerator.is_main_process`,
    `trainer.is_world_process_zero()`: true on one rank (or one per node) only."""
    if isinstance(expr, ast.Call) and not expr.args:
        expr = expr.func
    if not isinstance(expr, ast.Attribute):
        return False
    kind = receiver_kind(expr.value, module)
    return kind is not None and expr.attr in _ZERO_FLAGS.get(kind, ())


def zero_decorator(function: ast.AST, module: ModuleIndex) -> ast.expr | None:
    """The `@rank_zero_only` / `@accelerator.on_main_process` decorator of a function, if any."""
    for decorator in getattr(function, "decorator_list", ()):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = leaf(module.qualname(target))
        if name in _ZERO_DECORATORS:
            return decorator
        if name in ("on_process", "on_local_process"):
            return decorator
    return None


def zero_only_function(node: ast.AST, module: ModuleIndex) -> ast.AST | None:
    """The innermost function enclosing `node`, when a rank-0 decorator runs it on rank 0 only."""
    for parent in module.ancestors(node):
        if isinstance(parent, FUNCTIONS):
            return parent if zero_decorator(parent, module) is not None else None
    return None


def framework_collective(call: ast.Call, name: str, module: ModuleIndex) -> str | None:
    """What the call is, when it is a framework's collective ("self.log(..., sync_dist=True)",
    "accelerator.gather()"); None otherwise."""
    if name.startswith("accelerate.") and leaf(name) in _ACCELERATE_FUNCTIONS:
        return f"{leaf(name)}()"
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    kind = receiver_kind(func.value, module)
    if kind is None:
        return None
    method = func.attr
    receiver = ast.unparse(func.value)
    if kind == "lightning" and method in ("log", "log_dict"):
        if constant(kwarg(call, "sync_dist")) is True:
            return f"{receiver}.{method}(..., sync_dist=True)"
        return None
    if method in _COLLECTIVES.get(kind, ()):
        return f"{receiver}.{method}()"
    return None
