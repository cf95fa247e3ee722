"""Where a collective was called from: the user's line, and the framework code that issued it.

Frameworks stand between the user's line and torch.distributed: a `self.trainer.strategy.barrier()`
in a LightningModule reaches `dist.barrier` through Lightning's strategy, `self.log(...,
sync_dist=True)` through half a dozen Lightning frames. A diagnosis that names only the
collective ("barrier #16") or the innermost frame (torch's) tells the user nothing; the site names

    user    the innermost frame of the user's own code (not the standard library, site-packages,
            torch or ddpdoctor): `lit_job.py:24 Model.on_train_epoch_end`
    via     the framework function that frame called (`DDPStrategy.barrier`, `LightningModule.log`,
            `Accelerator.gather`): what the user wrote
    issuer  the innermost framework frame, the one that called torch.distributed, when it is not
            `via` itself (`_sync_ddp` under `LightningModule.log`)

Cost: this runs on every recorded explicit collective (never on DDP's gradient buckets), so the
walk stops at the first user frame, each file is classified once (a dict lookup afterwards), and a
site's JSON text is built once per distinct site. A hand-written loop that calls `dist.all_reduce`
itself pays one frame and two lookups.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from ddpdoctor.protocol.events import JOIN_FILE
from ddpdoctor.runtime.progress_probe import is_user_file
from ddpdoctor.runtime.records import fields_text

USER, FRAMEWORK, INTERNAL = 0, 1, 2
_KINDS: dict[str, int] = {}  # co_filename -> USER | FRAMEWORK | INTERNAL
_MAX_DEPTH = 96  # frames walked at most: a site deeper than that is not worth the walk
_CALLER_DEPTH = 32  # ... from the site's frame to its user caller
# the frames that tell a site apart -> (their code objects, the site's JSON text)
_SITES: dict[tuple[int, ...], tuple[Any, Any, Any, str]] = {}
MAX_SITES = 1024
_PACKAGE_DIRS = ("site-packages", "dist-packages")
# Framework functions that run a collective for a call the user made earlier (Lightning computes a
# metric logged with `sync_dist=True` at the epoch's end, with no user frame that logged it on the
# stack): id of the code object -> (the code object, what names the earlier call's site as the
# JSON text site_of returns, or None to go on walking). Looked up only for framework frames.
SiteOrigin = Callable[[FrameType], "str | None"]
_ORIGINS: dict[int, tuple[Any, SiteOrigin]] = {}


def kind_of(filename: str) -> int:
    """USER, FRAMEWORK (a package in site-packages other than torch) or INTERNAL (the standard
    library, torch, ddpdoctor, frozen modules), remembered per file name."""
    kind = _KINDS.get(filename)
    if kind is None:
        if is_user_file(filename):
            kind = USER
        elif _is_framework_file(filename):
            kind = FRAMEWORK
        else:
            kind = INTERNAL
        if len(_KINDS) > 4096:
            _KINDS.clear()
        _KINDS[filename] = kind
    return kind


def _is_framework_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    parts = os.path.realpath(filename).split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in _PACKAGE_DIRS:
            top = parts[i + 1].removesuffix(".py")
            if top == "torch":  # torch's Join makes collectives of its own: a site says so
                return "/".join(parts[i + 1 :]) == JOIN_FILE
            return top not in ("ddpdoctor", "functorch")
    return False


def package_path(filename: str) -> str:
    """`lightning/pytorch/strategies/ddp.py` for a file in site-packages (else its base name)."""
    parts = filename.split(os.sep)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in _PACKAGE_DIRS:
            return "/".join(parts[i + 1 :])
    return os.path.basename(filename)


def _name(code: Any) -> str:
    return getattr(code, "co_qualname", None) or code.co_name


def site_of(frame: FrameType | None) -> str | None:
    """The site of a call whose caller is `frame`, as the JSON text of the event's `site` field
    (`"site":{...}`), or None when no frame of the user's code is on the stack."""
    via: FrameType | None = None  # the outermost framework frame seen so far
    issuer: FrameType | None = None  # the innermost framework frame
    depth = 0
    kinds = _KINDS
    while frame is not None and depth < _MAX_DEPTH:
        code = frame.f_code
        kind = kinds.get(code.co_filename)
        if kind is None:
            kind = kind_of(code.co_filename)
        if kind == USER:
            break
        if kind == FRAMEWORK:
            via = frame
            if issuer is None:
                issuer = frame
            if _ORIGINS:
                origin = _ORIGINS.get(id(code))
                if origin is not None and origin[0] is code:
                    text = _origin_site(origin[1], frame)
                    if text is not None:
                        return text
        frame = frame.f_back
        depth += 1
    else:
        return None
    # keyed by the code objects' ids (hashing a code object hashes its bytecode); the entry
    # holds the objects themselves, so an id reused by a new code object is told apart
    user_code = frame.f_code
    via_code = via.f_code if via is not None else None
    issuer_code = issuer.f_code if issuer is not None else None
    key = (
        id(user_code),
        frame.f_lineno,
        id(via_code),
        via.f_lineno if via is not None else 0,
        id(issuer_code),
        issuer.f_lineno if issuer is not None else 0,
    )
    entry = _SITES.get(key)
    if (
        entry is None
        or entry[0] is not user_code
        or entry[1] is not via_code
        or entry[2] is not issuer_code
    ):
        entry = (user_code, via_code, issuer_code, _encode(frame, via, issuer))
        if len(_SITES) >= MAX_SITES:
            _SITES.clear()
        _SITES[key] = entry
    return entry[3]


def _frame_fields(frame: FrameType, *, package: bool) -> dict[str, Any]:
    code = frame.f_code
    name = package_path(code.co_filename) if package else code.co_filename
    return {"file": name, "line": frame.f_lineno, "function": _name(code)}


def _encode(user: FrameType, via: FrameType | None, issuer: FrameType | None) -> str:
    site: dict[str, Any] = _frame_fields(user, package=False)
    site["via"] = _frame_fields(via, package=True) if via is not None else None
    if issuer is not None and issuer is not via:
        site["issuer"] = _frame_fields(issuer, package=True)
    caller = _user_caller(user)
    if caller is not None:
        site["caller"] = _frame_fields(caller, package=False)
    return fields_text({"site": site})


def _user_caller(user: FrameType) -> FrameType | None:
    """The user's line that called the function holding the site (a checkpoint helper's call in
    the training loop), when that function is not the script's top level: walked once per
    site, as its text is made, never per call. None for the top level's call of `main()`."""
    if user.f_code.co_name == "<module>":
        return None
    frame = user.f_back
    depth = 0
    while frame is not None and depth < _CALLER_DEPTH:
        if kind_of(frame.f_code.co_filename) == USER:
            # the script's top level calling main(): no news
            return frame if frame.f_code.co_name != "<module>" else None
        frame = frame.f_back
        depth += 1
    return None


def _origin_site(origin: SiteOrigin, frame: FrameType) -> str | None:
    try:
        return origin(frame)
    except Exception:  # noqa: BLE001 - a framework that changed: walk on as for any frame
        return None


def register_origin(code: Any, origin: SiteOrigin) -> None:
    """Calls made under `code` (a framework function's code object) take the site `origin` names,
    when it names one: the user's earlier call that this one carries out."""
    _ORIGINS[id(code)] = (code, origin)


def unregister_origin(code: Any) -> None:
    entry = _ORIGINS.get(id(code))
    if entry is not None and entry[0] is code:
        del _ORIGINS[id(code)]


def caller_site(skip: int) -> str | None:
    """The site of the call `skip` frames above the caller of this function (never raises)."""
    try:
        return site_of(sys._getframe(skip + 1))
    except Exception:  # noqa: BLE001 - a site is a nicety; the collective goes on without it
        return None


def forget() -> None:
    """Drop what was remembered (tests; a file that moved)."""
    _KINDS.clear()
    _SITES.clear()
