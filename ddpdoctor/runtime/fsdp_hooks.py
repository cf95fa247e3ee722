"""FSDP2 (`fully_shard`) and DeviceMesh: units, steps and the SPMD contract.

- `fully_shard(module, ...)` is wrapped to remember the user's line that called it (one frame
  walk per call, at model build time) on the module it wraps.
- Each unit's collectives (the all-gather of its parameters in `FSDPParamGroup.unshard`, the
  reduce-scatter of its gradients, and HSDP's all-reduce, in `post_backward`) run with the unit's
  site set (c10d_hooks.NESTING.unit): the collective's event names the unit's module and the
  line that wrapped it, in place of a frame walk. The site text is made once per unit.
- The root's first pre-forward of each iteration is a training forward, as DDP's is
  (steps.py): with grad enabled it may train, synced unless `set_requires_gradient_sync(False)`,
  and an optimizer step confirms it. A forward under `no_grad` is evaluation.
- At the root's first forward, once FSDP knows its units' names (its lazy init) and before
  any all-gather, the contract is compared across ranks (fingerprint.py); `init_device_mesh`
  compares the mesh it made.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ddpdoctor.runtime import call_sites, core, fingerprint, replica_sources
from ddpdoctor.runtime.c10d_hooks import NESTING
from ddpdoctor.runtime.ddp_hooks import batch_size_of
from ddpdoctor.runtime.import_hooks import when_imported
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch
from ddpdoctor.runtime.records import fields_text

SITE_ATTR = "_ddpdoctor_fully_shard_site"  # on a module fully_shard wrapped: fingerprint.Where
TEXT_ATTR = "_ddpdoctor_unit_site"  # on an FSDPParamGroup: its collectives' site text
ROOT_ATTR = "_ddpdoctor_root_seen"  # on a root FSDPState: its contract was compared
FSDP_FILE = "torch/distributed/fsdp/_fully_shard/_fully_shard.py"
RAN_ATTR = "_ddpdoctor_ran_from"  # on an FSDPParamGroup: (user code id, line) -> (code, text)
_MAX_WALK = 48  # frames walked at most from a unit's unshard to the user's line


def unit_text(
    fqn: str,
    where: fingerprint.Where | None,
    ran: fingerprint.Where | None = None,
    caller: fingerprint.Where | None = None,
) -> str:
    """The `site` (and `unit`) of a unit's collectives, as JSON members to splice into events:
    the line that called fully_shard, via `fully_shard[<module>]`; with `ran`, the user's line
    that ran the unit, via `fully_shard[<module>]` at the line that wrapped it (and `caller`:
    the user's line that called the function holding `ran`, a helper's call in the loop)."""
    name = fqn or fingerprint.ROOT_NAME
    unit: dict[str, Any] = {"module": name}
    fields: dict[str, Any] = {}
    if where is not None:
        unit.update(file=where[0], line=where[1])
    via = {"file": FSDP_FILE, "line": 0, "function": f"fully_shard[{name}]"}
    if ran is not None:
        if where is not None:
            via.update(file=where[0].replace("\\", "/").rpartition("/")[2], line=where[1])
        fields["site"] = {"file": ran[0], "line": ran[1], "function": ran[2], "via": via}
        if caller is not None:
            fields["site"]["caller"] = {"file": caller[0], "line": caller[1], "function": caller[2]}
    elif where is not None:
        file, line, function = where
        fields["site"] = {"file": file, "line": line, "function": function, "via": via}
    fields["unit"] = unit
    return fields_text(fields)


def site_of_group(group: Any) -> str | None:
    """A param group's site text, made once its module's name is known (FSDP's lazy init)."""
    text = group.__dict__.get(TEXT_ATTR)
    if text is not None:
        return text
    fqn = getattr(group, "_module_fqn", None)
    if fqn is None:
        return None
    modules = getattr(group, "modules", None) or ()
    where = modules[0].__dict__.get(SITE_ATTR) if modules else None
    text = unit_text(fqn, where)
    group.__dict__[TEXT_ATTR] = text
    return text


def ran_from_text(group: Any, frame: Any) -> str | None:
    """The site of a unit's all-gather as the user's line that ran the unit (the forward line
    that called the wrapped module, `loss.backward()`, the `unshard()` call), via
    `fully_shard[<module>]` at the line that wrapped it: a unit run on one rank only is named
    where it was run, not only where it was wrapped. None: no user frame (the unit's own text).

    Cost: a walk to the first user frame (files classified once), and the text made once per
    (unit, line): a dict lookup afterwards."""
    depth = 0
    kinds = call_sites._KINDS
    while frame is not None and depth < _MAX_WALK:
        code = frame.f_code
        kind = kinds.get(code.co_filename)
        if kind is None:
            kind = call_sites.kind_of(code.co_filename)
        if kind == call_sites.USER:
            break
        frame = frame.f_back
        depth += 1
    else:
        return None
    code = frame.f_code
    key = (id(code), frame.f_lineno)
    texts = group.__dict__.get(RAN_ATTR)
    if texts is None:
        texts = group.__dict__[RAN_ATTR] = {}
    entry = texts.get(key)
    if entry is not None and entry[0] is code:
        return entry[1]
    fqn = getattr(group, "_module_fqn", None)
    if fqn is None:
        return None
    modules = getattr(group, "modules", None) or ()
    where = modules[0].__dict__.get(SITE_ATTR) if modules else None
    name = getattr(code, "co_qualname", None) or code.co_name
    up = call_sites._user_caller(frame)
    caller = None
    if up is not None:
        up_code = up.f_code
        caller = (
            up_code.co_filename,
            up.f_lineno,
            getattr(up_code, "co_qualname", up_code.co_name),
        )
    text = unit_text(fqn, where, (code.co_filename, frame.f_lineno, name), caller)
    if len(texts) < 64:
        texts[key] = (code, text)
    return text


def _in_unit(method: Any, ran_from: bool = False) -> Any:
    """Wrap an FSDPParamGroup method so that the collectives it issues carry the unit's site
    (`ran_from`: the user's line that ran the unit, ran_from_text)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if core._active is None:
            return method(self, *args, **kwargs)
        try:
            text = ran_from_text(self, sys._getframe(1)) if ran_from else None
            if text is None:
                text = self.__dict__.get(TEXT_ATTR) or site_of_group(self)
        except Exception:  # noqa: BLE001
            text = None
        outer = NESTING.unit
        NESTING.unit = text
        try:
            return method(self, *args, **kwargs)
        finally:
            NESTING.unit = outer

    return wrapper


def contract_of_root(state: Any, module: Any) -> list[fingerprint.Entry]:
    """The root's units (module, mesh, parameter count) and every parameter (global shapes:
    FSDP's parameters are DTensors), each made at its unit's fully_shard line."""
    entries: list[fingerprint.Entry] = []
    where_by_unit: dict[str, fingerprint.Where | None] = {}
    for st in state._state_ctx.all_states:
        for group in st._fsdp_param_groups:
            fqn = group._module_fqn or ""
            modules = getattr(group, "modules", None) or ()
            where = modules[0].__dict__.get(SITE_ATTR) if modules else None
            where_by_unit[fqn] = where
            mesh = fingerprint.mesh_text(group.mesh_info.mesh)
            value = f"{mesh}, {len(group.fsdp_params)} parameters"
            entries.append((f"unit {fqn}" if fqn else fingerprint.ROOT_UNIT, value, where))

    def where_of(name: str) -> fingerprint.Where | None:
        prefix = name
        while prefix:
            prefix = prefix.rpartition(".")[0]
            if prefix in where_by_unit:
                return where_by_unit[prefix]
        return where_by_unit.get("")

    entries.extend(fingerprint.param_entries(module.named_parameters(), where_of))
    return entries


def members_of(state: Any) -> list[int] | None:
    """The global ranks of the root's mesh (the ranks it shards and replicates over): its own
    unit's, or, for a root left without parameters of its own, its first unit's."""
    groups = [state._fsdp_param_group] + [
        group for st in state._state_ctx.all_states for group in st._fsdp_param_groups
    ]
    for group in groups:
        if group is not None:
            return sorted(int(r) for r in group.mesh_info.mesh.mesh.flatten().tolist())
    return None


def on_root_forward(rt: core.Runtime, state: Any, module: Any, args: Any, kwargs: Any) -> None:
    import torch

    if not state.__dict__.get(ROOT_ATTR):
        state.__dict__[ROOT_ATTR] = True
        for st in state._state_ctx.all_states:
            for group in st._fsdp_param_groups:
                site_of_group(group)
        where = module.__dict__.get(SITE_ATTR)
        cls = type(module)
        name = cls.__bases__[-1].__name__ if cls.__name__.startswith("FSDP") else cls.__name__
        title = f"the FSDP model {name} (fully_shard at {fingerprint.place(where)})"
        fingerprint.compare(rt, "fsdp", title, contract_of_root(state, module), members_of(state))
    if torch.is_grad_enabled():
        training = module.training
        if training and rt.auto_phase and rt.phase != core.AUTO_TRAIN:
            rt.set_phase(core.AUTO_TRAIN, auto=True)
        group = state._fsdp_param_group
        synced = bool(getattr(group, "reduce_grads", True)) if group is not None else True
        rt.steps.on_forward(rt.mono_clock(), True, synced, batch_size_of(args, kwargs), training)
        if synced:  # HSDP's replicated shards may be due for a digest (replica_sources.py)
            replica_sources.on_fsdp_root_forward(rt, state)
    else:
        if rt.auto_phase and rt.phase != core.AUTO_EVAL:
            rt.set_phase(core.AUTO_EVAL, auto=True)
        rt.steps.on_forward(rt.mono_clock(), False, False, None)


def _remember_site(init: Any) -> Any:
    @functools.wraps(init)
    def wrapper(self: Any, modules: Any, *args: Any, **kwargs: Any) -> Any:
        if core._active is not None:
            try:
                mods = tuple(modules) if isinstance(modules, list | tuple) else (modules,)
                if mods and SITE_ATTR not in mods[0].__dict__:
                    where = fingerprint.caller(1)
                    for mod in mods:
                        mod.__dict__[SITE_ATTR] = where
            except Exception:  # noqa: BLE001 - an odd module: its unit goes unnamed
                pass
        return init(self, modules, *args, **kwargs)

    return wrapper


def install_fsdp(runtime: core.Runtime) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state
    from torch.distributed.fsdp._fully_shard import _fully_shard as impl

    original = impl.fully_shard
    if hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        where = fingerprint.caller(1) if core._active is not None else None
        result = original(module, *args, **kwargs)
        if where is not None:
            try:
                for mod in module if isinstance(module, list | tuple) else (module,):
                    mod.__dict__[SITE_ATTR] = where
            except Exception:  # noqa: BLE001 - an odd module: its unit goes unnamed
                pass
        return result

    import torch.distributed.fsdp as fsdp_package
    import torch.distributed.fsdp._fully_shard as fsdp_inner

    for owner in (impl, fsdp_inner, fsdp_package):
        if vars(owner).get("fully_shard") is original:
            patch(runtime, owner, "fully_shard", fully_shard, original)

    group_cls = _fsdp_param_group.FSDPParamGroup
    for name in ("unshard", "post_backward"):
        method = vars(group_cls).get(name)
        if method is not None and not hasattr(method, WRAPPED_MARK):
            patch(runtime, group_cls, name, _in_unit(method, name == "unshard"), method)

    # fully_shard's line, however the script holds fully_shard (imported before the runtime
    # started, from the older _composable path, by attribute): its state's init runs inside
    # every call, one frame walk per wrapped module at build time
    state_init = vars(_fsdp_state.FSDPState).get("init")
    if state_init is not None and not hasattr(state_init, WRAPPED_MARK):
        patch(runtime, _fsdp_state.FSDPState, "init", _remember_site(state_init), state_init)

    state_cls = _fsdp_state.FSDPState
    root_pre_forward = state_cls._root_pre_forward

    @functools.wraps(root_pre_forward)
    def _root_pre_forward(self: Any, module: Any, args: Any, kwargs: Any) -> Any:
        rt = core._active
        if rt is None:
            return root_pre_forward(self, module, args, kwargs)
        ctx = self._state_ctx
        fresh = ctx.iter_forward_root is None
        out = root_pre_forward(self, module, args, kwargs)
        if fresh and self._state_ctx.iter_forward_root is self:
            try:
                on_root_forward(rt, self, module, args, kwargs)
            except Exception:  # noqa: BLE001 - recording must never break the forward
                pass
        return out

    patch(runtime, state_cls, "_root_pre_forward", _root_pre_forward, root_pre_forward)


def install_mesh(runtime: core.Runtime, module: Any) -> None:
    original = getattr(module, "init_device_mesh", None)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
        mesh = original(*args, **kwargs)
        rt = core._active
        if rt is not None:
            try:
                where = fingerprint.caller(1)
                title = f"the device mesh made at {fingerprint.place(where)}"
                entry = ("mesh", fingerprint.mesh_text(mesh), where)
                fingerprint.compare(rt, "mesh", title, [entry])
            except Exception:  # noqa: BLE001
                pass
        return mesh

    patch(runtime, module, "init_device_mesh", init_device_mesh, original)
    import torch.distributed as dist

    if vars(dist).get("init_device_mesh") is original:
        patch(runtime, dist, "init_device_mesh", init_device_mesh, original)


def install(runtime: core.Runtime) -> None:
    """Hook FSDP2 and DeviceMesh once the script imports them (now, if it has)."""

    def fsdp_imported(_module: Any) -> None:
        if core.active() is runtime:
            install_fsdp(runtime)

    def mesh_imported(module: Any) -> None:
        if core.active() is runtime:
            install_mesh(runtime, module)

    when_imported("torch.distributed.fsdp", fsdp_imported)
    when_imported("torch.distributed.device_mesh", mesh_imported)
