"""GPU code on a machine without a GPU: a script that hard-codes NCCL or CUDA fails at its first
such line when no GPU is visible ("Found no NVIDIA driver on your system", "ProcessGroupNCCL is
only supported with GPUs, no GPUs found!", "device_ids ... only work with ... GPU modules").

Published DDP examples are written for GPU machines: `init_process_group(backend="nccl")`,
`torch.cuda.set_device(local_rank)`, `model.cuda()` / `.to(f"cuda:{rank}")`,
`DDP(model, device_ids=[local_rank])`, Lightning's `Trainer(accelerator="gpu")`. This rule is
not one of the machine-independent rules: it runs only when the doctor's GPU facts (the probes:
ddpdoctor/checks/gpu_plan.py) say the job will see no GPU. Code that picks its device or
backend itself (`"nccl" if torch.cuda.is_available() else "gloo"`, anything under an `if` that
asks about CUDA) is left alone: doubt means silence.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.rulebase import finding
from ddpdoctor.checks.scriptcheck.scopes import (
    ModuleIndex,
    Project,
    constant,
    is_ddp,
    is_dist,
    kwarg,
    leaf,
)
from ddpdoctor.findings import Severity

GPU_WITHOUT_GPU = "script.gpu_code_without_gpu"
_CUDA_TEST_WORDS = ("cuda", "gpu", "device_count", "is_available", "nccl")
_WHY = {
    "nccl": "NCCL runs on GPUs only: init_process_group fails at once with 'ProcessGroupNCCL is "
    "only supported with GPUs, no GPUs found!'",
    "cuda": "no GPU is visible here: the first CUDA call fails with 'Found no NVIDIA driver on "
    "your system' (or 'No CUDA GPUs are available')",
    "device_ids": "device_ids names a GPU: DDP refuses a module on the CPU with device_ids set",
    "accelerator": "Lightning stops before training: no GPU is available for accelerator='gpu'",
}
_FIX = {
    "nccl": 'backend = "nccl" if torch.cuda.is_available() else "gloo" (or run on a GPU machine)',
    "cuda": 'device = torch.device("cuda", local_rank) if torch.cuda.is_available() else '
    'torch.device("cpu"); call torch.cuda.set_device only when CUDA is available; model.to(device)',
    "device_ids": "DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)",
    "accelerator": 'Trainer(accelerator="auto") (or "cpu" on this machine)',
}


def gpu_code_without_gpu(project: Project) -> Iterator[ScriptFinding]:
    """The first hard-coded use of each kind (NCCL, CUDA, device_ids, a GPU accelerator)."""
    seen: set[str] = set()
    for module, call, name in project.all_calls():
        found = _gpu_use(module, call, name)
        if found is None or found[0] in seen or _cuda_guarded(call, module):
            continue
        kind, what = found
        seen.add(kind)
        yield finding(
            GPU_WITHOUT_GPU,
            Severity.ERROR,
            module,
            call,
            f"{what} needs a GPU, and this machine has none visible",
            why=_WHY[kind],
            fix=_FIX[kind],
        )


def _gpu_use(module: ModuleIndex, call: ast.Call, name: str) -> tuple[str, str] | None:
    if is_dist(name, "init_process_group"):
        backend = kwarg(call, "backend") or (call.args[0] if call.args else None)
        if backend is not None and _always(backend, module, lambda v: v == "nccl"):
            return "nccl", 'init_process_group(backend="nccl")'
        return None
    short = leaf(name)
    if name in ("torch.cuda.set_device", "torch.cuda.device"):
        return "cuda", f"torch.cuda.{short}()"
    if short == "cuda" and isinstance(call.func, ast.Attribute) and name != "torch.cuda":
        return "cuda", ".cuda()"
    if short == "to" and call.args and _always(call.args[0], module, _cuda_text):
        return "cuda", '.to("cuda...")'
    if name == "torch.device" and call.args and _always(call.args[0], module, _cuda_text):
        return "cuda", 'torch.device("cuda...")'
    if is_ddp(name):
        ids = kwarg(call, "device_ids")
        if isinstance(ids, (ast.List, ast.Tuple)) and ids.elts:
            return "device_ids", "DDP(..., device_ids=[...])"
        return None
    if short in ("Trainer", "Fabric"):
        accelerator = kwarg(call, "accelerator")
        if accelerator is not None and constant(accelerator) in ("gpu", "cuda"):
            return "accelerator", f'{short}(accelerator="{constant(accelerator)}")'
    return None


def _cuda_text(value: object) -> bool:
    return isinstance(value, str) and value.split(":", 1)[0] == "cuda"


def _always(expr: ast.expr, module: ModuleIndex, test, depth: int = 0) -> bool:
    """Whether `expr` is always a value that passes `test`: a literal, an f-string that starts
    with one ("cuda:{rank}"), or a local name every assignment of which is one."""
    if depth > 3:
        return False
    value = constant(expr)
    if isinstance(value, str):
        return bool(test(value))
    if isinstance(expr, ast.JoinedStr) and expr.values:
        head = constant(expr.values[0])
        return isinstance(head, str) and bool(test(head.split("{", 1)[0]))
    if isinstance(expr, ast.Name):
        scope = module.scope_of(expr)
        values = [v for _, v in module.assignments(scope).get(expr.id, ())]
        values = values or [v for _, v in module.assignments(module.source.tree).get(expr.id, ())]
        return bool(values) and all(_always(v, module, test, depth + 1) for v in values)
    return False


def _cuda_guarded(node: ast.AST, module: ModuleIndex) -> bool:
    """Under an `if` (or a conditional expression) that asks about CUDA or GPUs."""
    for parent in module.ancestors(node):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)):
            text = ast.unparse(parent.test).lower()
            if any(word in text for word in _CUDA_TEST_WORDS):
                return True
        if isinstance(parent, ast.Try):  # a script that catches the failure handles it
            return True
    return False
