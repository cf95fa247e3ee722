"""DDP's reducer errors, named where only the rank knows the names.

"Expected to have finished reduction in the prior iteration" lists the parameters that got no
gradient by their index in the reducer's list (`Parameter indices which did not receive grad for
rank 0: 2 3`; names only under TORCH_DISTRIBUTED_DEBUG=INFO). The rank holds the model, so when
DDP's forward raises it, the indices are turned into the parameters' names the way DDP orders
them (`_build_params_for_reducer`: modules in order, their own parameters that require grad and
are not ignored, each once) and written as a warning event (`ddp.unused_parameter_names`)
before the error goes on its way unchanged.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.protocol.events import WARNING
from ddpdoctor.runtime import core

CODE = "ddp.unused_parameter_names"
MARKER = "did not receive grad for rank"
MAX_NAMES = 20


def reducer_names(ddp: Any) -> list[str]:
    """The names of the reducer's parameters, in its order."""
    ignored = getattr(ddp, "parameters_to_ignore", ()) or ()
    seen: set[int] = set()
    names: list[str] = []
    for module_name, module in ddp.module.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if not param.requires_grad or f"{module_name}.{param_name}" in ignored:
                continue
            if id(param) in seen:
                continue
            seen.add(id(param))
            names.append(full)
    return names


def unused_indices(message: str) -> list[int]:
    """The indices after "... did not receive grad for rank N:" (bounded: one line, 4096 chars)."""
    at = message.find(MARKER)
    if at < 0:
        return []
    line = message[at : at + 4096].split("\n", 1)[0]
    _, _, numbers = line.partition(":")
    return [int(word) for word in numbers.split()[:4096] if word.isdigit()]


def on_forward_error(ddp: Any, exc: BaseException) -> None:
    """Name the parameters of a reduction error (never raises)."""
    rt = core._active
    if rt is None or not isinstance(exc, RuntimeError):
        return
    try:
        indices = unused_indices(str(exc))
        if not indices:
            return
        names = reducer_names(ddp)
        named = [names[i] for i in indices if 0 <= i < len(names)]
        if not named:
            return
        shown = ", ".join(named[:MAX_NAMES]) + (" ..." if len(named) > MAX_NAMES else "")
        rt.emit(
            WARNING,
            code=CODE,
            message=f"parameters that received no gradient in the last iteration: {shown}",
            details={"names": named[:MAX_NAMES], "indices": indices[:MAX_NAMES]},
        )
    except Exception:  # noqa: BLE001
        pass
