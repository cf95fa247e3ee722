"""Putting a wrapper in place of a framework's function, and taking it out with the runtime."""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.runtime import core

WRAPPED_MARK = "__ddpdoctor_original__"  # a wrapper's attribute naming what it wraps


def patch(runtime: core.Runtime, owner: Any, name: str, new: Any, old: Any) -> None:
    """Set `owner.name` to `new` (which wraps `old`) until `runtime` stops recording."""
    setattr(new, WRAPPED_MARK, old)
    setattr(owner, name, new)
    runtime.on_deactivate(functools.partial(_restore, owner, name, new, old))


def _restore(owner: Any, name: str, new: Any, old: Any) -> None:
    # unless something else replaced it since (the owner's own attribute: a class or a module)
    if vars(owner).get(name) is new:
        setattr(owner, name, old)
