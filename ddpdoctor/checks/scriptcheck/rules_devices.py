"""Device rules: every rank on GPU 0, DDP's device_ids, SyncBatchNorm and the model's device."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.guards import env_key
from ddpdoctor.checks.scriptcheck.rulebase import finding, is_distributed, rule
from ddpdoctor.checks.scriptcheck.scopes import (
    NOT_CONSTANT,
    ModuleIndex,
    Project,
    constant,
    is_ddp,
    is_dist,
    kwarg,
    leaf,
    target_key,
    walk_scope,
)
from ddpdoctor.findings import Severity

DEVICE = "script.device_hardcoded"
DEVICE_IDS = "script.device_ids_not_local_rank"
SYNCBN = "script.syncbn_after_ddp"
NOT_MOVED = "script.model_not_on_device"
GLOBAL_RANK_ENV = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"})
_SETS_DEVICE = ("set_device", "set_device_index")
_MOVES = ("to", "cuda", "to_empty")
_WHY_GPU0 = (
    "every rank uses GPU 0: NCCL fails with 'Duplicate GPU detected' (or all ranks crowd one GPU "
    "and run out of memory)"
)
_FIX_LOCAL = (
    'local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank); then '
    "model.to(local_rank)"
)


def _fixed_device(expr: ast.expr | None) -> bool:
    value = constant(expr)
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and value.startswith("cuda:")


@rule(
    DEVICE, Severity.WARNING, "`torch.cuda.set_device(0)` or `model.cuda()` without the local rank"
)
def device_hardcoded(project: Project) -> Iterator[ScriptFinding]:
    if not is_distributed(project):
        return
    sets_device = False
    for module, call, name in project.all_calls():
        if leaf(name) in _SETS_DEVICE or name == "torch.cuda.device":
            sets_device = True
            if call.args and _fixed_device(call.args[0]):
                yield finding(
                    DEVICE,
                    Severity.WARNING,
                    module,
                    call,
                    f"{leaf(name)}() gets a fixed device, not the local rank",
                    why=_WHY_GPU0,
                    fix=_FIX_LOCAL,
                )
    if sets_device:
        return
    for module in project.modules:  # the first bare .cuda() / .to("cuda") of each file
        for call, name in module.calls:
            bare_cuda = leaf(name) == "cuda" and not call.args and not call.keywords
            to_cuda = leaf(name) == "to" and call.args and constant(call.args[0]) == "cuda"
            if (bare_cuda or to_cuda) and isinstance(call.func, ast.Attribute):
                yield finding(
                    DEVICE,
                    Severity.WARNING,
                    module,
                    call,
                    "tensors and the model go to the default GPU and no set_device(local_rank) "
                    "is called anywhere",
                    why=_WHY_GPU0,
                    fix=_FIX_LOCAL,
                )
                break


def _global_rank(expr: ast.expr, module: ModuleIndex, depth: int = 0) -> bool:
    """Provably the *global* rank: dist.get_rank() or $RANK, directly or through a local name."""
    if depth > 4:
        return False
    if isinstance(expr, ast.Call):
        name = module.qualname(expr.func)
        if name == "int" and len(expr.args) == 1:
            return _global_rank(expr.args[0], module, depth + 1)
        if is_dist(name, "get_rank"):
            return True
    if env_key(expr, module) in GLOBAL_RANK_ENV:
        return True
    if isinstance(expr, ast.Name):
        values = module.assignments(module.scope_of(expr)).get(expr.id, ())
        return bool(values) and all(_global_rank(v, module, depth + 1) for _, v in values)
    return False


@rule(DEVICE_IDS, Severity.WARNING, "DDP `device_ids` not `[local_rank]`")
def device_ids_not_local_rank(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if not is_ddp(name):
            continue
        ids = kwarg(call, "device_ids")
        if not isinstance(ids, (ast.List, ast.Tuple)) or len(ids.elts) != 1:
            continue
        device = ids.elts[0]
        if _fixed_device(device):
            summary = "DDP gets a fixed device_ids, the same on every rank"
            why = _WHY_GPU0.replace("GPU 0", "the same GPU")
        elif _global_rank(device, module):
            summary = "DDP gets the global rank as its device, not the local rank"
            why = (
                "on the second node the global rank exceeds the GPU count: 'invalid device ordinal'"
            )
        else:
            continue
        yield finding(
            DEVICE_IDS,
            Severity.WARNING,
            module,
            call,
            summary,
            why=why,
            fix='device_ids=[local_rank] with local_rank = int(os.environ["LOCAL_RANK"])',
        )


def _ddp_bindings(module: ModuleIndex, scope: ast.AST) -> list[tuple[ast.Call, set[str]]]:
    """Each DDP(...) call of `scope` with the keys it touches: its target and its module argument."""
    found: list[tuple[ast.Call, set[str]]] = []
    for node in walk_scope(scope):
        if isinstance(node, ast.Call) and is_ddp(module.qualname(node.func)):
            keys = {target_key(node.args[0])} if node.args else set()
            parent = module.parents.get(node)
            if isinstance(parent, ast.Assign):
                keys |= {target_key(t) for t in parent.targets}
            found.append((node, {key for key in keys if key is not None}))
    return found


@rule(SYNCBN, Severity.WARNING, "`convert_sync_batchnorm` after wrapping in DDP")
def syncbn_after_ddp(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if leaf(name) != "convert_sync_batchnorm" or not call.args:
            continue
        key = target_key(call.args[0])
        if key is None:
            continue
        for ddp, keys in _ddp_bindings(module, module.scope_of(call)):
            if ddp.lineno < call.lineno and key in keys:
                yield finding(
                    SYNCBN,
                    Severity.WARNING,
                    module,
                    call,
                    f"convert_sync_batchnorm comes after the DDP wrap of line {ddp.lineno}",
                    why="DDP was built around the plain BatchNorm layers: the converted model is "
                    "not the one DDP synchronises, so statistics stay per rank (or DDP sees "
                    "parameters it did not register)",
                    fix="model = nn.SyncBatchNorm.convert_sync_batchnorm(model) first, then "
                    "model.to(local_rank), then DDP(model, device_ids=[local_rank])",
                )
                break


def _moved(value: ast.expr, module: ModuleIndex) -> bool:
    if not isinstance(value, ast.Call):
        return True  # not built here: we cannot tell where it lives
    if leaf(module.qualname(value.func)) in _MOVES or kwarg(value, "device") is not None:
        return True
    return any(isinstance(a, ast.Call) and _moved(a, module) for a in value.args[:1])


@rule(NOT_MOVED, Severity.ERROR, "the model not moved to its GPU before DDP(device_ids=...)")
def model_not_on_device(project: Project) -> Iterator[ScriptFinding]:
    for module, call, name in project.all_calls():
        if not is_ddp(name) or not call.args:
            continue
        ids = kwarg(call, "device_ids")
        if ids is None or constant(ids) is not NOT_CONSTANT:  # device_ids=None: a CPU module
            continue
        key = target_key(call.args[0])
        scope = module.scope_of(call)
        values = [
            v for line, v in module.assignments(scope).get(key or "", ()) if line < call.lineno
        ]
        if not values or any(_moved(v, module) for v in values):
            continue
        if any(
            isinstance(node, ast.Call)
            and node.lineno < call.lineno
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MOVES
            and target_key(node.func.value) == key
            for node in walk_scope(scope)
        ):
            continue
        yield finding(
            NOT_MOVED,
            Severity.ERROR,
            module,
            call,
            f"{key} is still on the CPU when DDP(device_ids=...) wraps it",
            why="DDP raises ValueError at start: device_ids only works with a module on that GPU",
            fix=f"{key} = {key}.to(local_rank) before DDP({key}, device_ids=[local_rank])",
        )
