"""NCCL checks: availability and version, NCCL_* variables, interfaces, the debug log file, and
the transport switches.

Failure modes F08 (no NCCL in this torch), F14/F15/F16 (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
and the interfaces they pick), F22-F25 and F27 (transport switches set as workarounds, version
mismatches). Variables come from the environment and NCCL's configuration files (nccl_settings).
"""

from __future__ import annotations

import os
import platform

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.gpu_plan import job_backend, visible_gpu_count
from ddpdoctor.checks.model import CheckOutcome, failed, passed, skipped, warning
from ddpdoctor.checks.nccl_ifname import (
    gloo_problems,
    is_link_local_only,
    is_virtual,
    nccl_candidates,
    nccl_ifname_problems,
    routable_choice,
)
from ddpdoctor.checks.nccl_settings import (
    conf_files,
    nccl_settings,
    read_conf_files,
    setting_value,
)
from ddpdoctor.checks.nccl_transport import TRANSPORT_SWITCHES, switch_on, transport_problems
from ddpdoctor.checks.nccl_vars import (
    IMAGE_NOTE,
    RENAMED,
    is_image_set,
    is_known,
    nearest_names,
    value_fix,
    value_problem,
)
from ddpdoctor.checks.problems import Problem, outcome_from
from ddpdoctor.checks.registry import check


@check("nccl.available", "NCCL in torch", timeout_s=30)
def nccl_available(ctx: CheckContext) -> CheckOutcome:
    torch = ctx.probes.torch.facts()
    if not torch.installed:
        return skipped("torch is not installed (see gpu.cuda)")
    facts = {
        "built_in": torch.nccl_built_in,
        "version": torch.nccl_version,
        "library": torch.nccl_library,
        "linkage": torch.nccl_linkage,
        "package": torch.nccl_package,
        "package_version": torch.nccl_package_version,
        "torch_requires": torch.nccl_required,
        "platform": torch.platform,
    }
    asked = ctx.options.backend
    if not torch.nccl_built_in:
        reason = _why_no_nccl(torch)
        if asked == "nccl":
            return failed(
                f"--backend nccl, but {reason}: init_process_group fails with 'Distributed "
                "package doesn't have NCCL built in' (F08)",
                fix="use backend gloo, or install a CUDA build of torch on Linux (or WSL)",
                facts=facts,
            )
        return passed(f"{reason}: DDP will use gloo", facts=facts)
    problems = _version_problems(torch)
    details = [f"library: {torch.nccl_library or 'inside libtorch_cuda.so'}"]
    if torch.nccl_error:
        details.append(f"version not read: {torch.nccl_error}")
    version = torch.nccl_version or "version unknown"
    if visible_gpu_count(ctx) > 0:
        runtime = ctx.probes.torch.runtime(ctx.env)
        facts["torch_reports"] = runtime.nccl_version
        if runtime.error:
            details.append(f"torch.cuda.nccl.version() unknown: {runtime.error}")
        elif runtime.nccl_version and not torch.nccl_version:
            version = runtime.nccl_version  # linked into libtorch_cuda: only torch can tell
        elif runtime.nccl_version and torch.nccl_version != runtime.nccl_version:
            problems.append(
                Problem(
                    f"torch reports NCCL {runtime.nccl_version} but {torch.nccl_library} is "
                    f"{torch.nccl_version}: another libnccl is loaded (LD_PRELOAD or "
                    "LD_LIBRARY_PATH), so nodes can end up on different versions (F25)",
                    fix="load one NCCL everywhere: unset LD_PRELOAD / drop other libnccl "
                    "directories from LD_LIBRARY_PATH",
                    fatal=False,
                )
            )
            version = runtime.nccl_version
    summary = f"NCCL {version}"
    if torch.nccl_package:
        summary += f" ({torch.nccl_package} {torch.nccl_package_version})"
    if job_backend(ctx) == "gloo":
        summary += "; no GPU visible, so DDP will use gloo"
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


def _why_no_nccl(torch) -> str:
    if torch.platform != "linux":
        return f"NCCL exists only on Linux; torch on {torch.platform} has no nccl backend"
    if not torch.cuda_libs:
        return f"torch {torch.version} is a CPU-only build without NCCL"
    return f"torch {torch.version} was built without NCCL"


def _version_problems(torch) -> list[Problem]:
    problems: list[Problem] = []
    loaded, package = torch.nccl_version, torch.nccl_package_version
    if loaded and package and _release(package) != loaded:
        problems.append(
            Problem(
                f"torch loads NCCL {loaded} from {torch.nccl_library}, but "
                f"{torch.nccl_package} {package} is installed (F25)",
                fix=f"keep one NCCL: pip install {torch.nccl_package}=={loaded} (and the same "
                "version on every node)",
                fatal=False,
            )
        )
    required = torch.nccl_required
    if required and "==" in required and package:
        wanted = required.split("==", 1)[1].strip()
        if _release(package) != _release(wanted):
            problems.append(
                Problem(
                    f"torch {torch.version} was built against {required}, but "
                    f"{torch.nccl_package} {package} is installed (F25)",
                    fix=f"pip install '{required}'",
                    fatal=False,
                )
            )
    return problems


def _release(version: str) -> str:
    """2.20.5 from a wheel version such as 2.20.5 or 2.20.5.post1 (first three numbers)."""
    return ".".join(version.split("+")[0].split(".")[:3])


@check("nccl.env", "NCCL variables")
def nccl_env(ctx: CheckContext) -> CheckOutcome:
    settings = nccl_settings(ctx)
    files = conf_files(ctx)
    facts = {
        "settings": {s.name: s.value for s in settings.values()},
        "sources": {s.name: s.source for s in settings.values() if s.source != "environment"},
        "conf_files": files,
    }
    problems: list[Problem] = []
    image = sorted(s.name for s in settings.values() if is_image_set(s.name))
    for setting in sorted(settings.values(), key=lambda s: s.name):
        name, value, where = setting.name, setting.value, setting.where
        if name in image:  # container bookkeeping, no NCCL setting: listed below as info only
            continue
        if name in RENAMED:
            new, why = RENAMED[name]
            fix = f"export {new}={value} and unset {name}" if new else f"unset {name}"
            instead = f": use {new}" if new else ""
            problems.append(
                Problem(f"{name}{where} is an old name ({why}){instead}", fix=fix, fatal=False)
            )
            continue
        if not is_known(name):
            near = nearest_names(name)
            if near:
                problems.append(
                    Problem(
                        f"{name}{where} is not a variable NCCL or torch reads: did you mean "
                        f"{near[0]}?",
                        fix=f"rename {name} to {near[0]} (export {near[0]}={value})",
                        fatal=False,
                    )
                )
            else:
                problems.append(
                    Problem(
                        f"{name}{where} is not a variable NCCL or torch reads: it has no effect",
                        fix=f"remove {name}, or check its spelling in the NCCL documentation",
                        fatal=False,
                    )
                )
            continue
        problem = value_problem(name, value)
        if problem:
            problems.append(
                Problem(
                    f"{problem}{where}: NCCL ignores it and uses its default",
                    fix=value_fix(name),
                    fatal=False,
                )
            )
    details = [
        f"{s.name}={s.value}{s.where}" + (f": {IMAGE_NOTE}" if s.name in image else "")
        for s in sorted(settings.values(), key=lambda s: s.name)
    ]
    if len(settings) > len(image):
        summary = f"{len(settings) - len(image)} NCCL setting(s), all known and valid"
    else:
        summary = "no NCCL_* variables set (NCCL defaults)"
    found = list(read_conf_files(ctx))
    details.append(
        f"configuration files: {', '.join(found) or 'none'} (NCCL looks for {', '.join(files)})"
    )
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


@check("nccl.ifname", "Network interfaces for NCCL and gloo")
def nccl_ifname(ctx: CheckContext) -> CheckOutcome:
    interfaces = ctx.probes.net.interfaces()
    nccl_value = setting_value(ctx, "NCCL_SOCKET_IFNAME")
    family = setting_value(ctx, "NCCL_SOCKET_FAMILY")
    gloo_value = ctx.env.get("GLOO_SOCKET_IFNAME")
    multi = ctx.plan.multi_node
    uses_nccl = job_backend(ctx) == "nccl"
    chosen, rule = nccl_candidates(nccl_value, interfaces, family)
    good = routable_choice(interfaces)
    facts = {
        "nccl_would_use": [i.name for i in chosen],
        "nccl_rule": rule,
        "nccl_socket_ifname": nccl_value,
        "gloo_socket_ifname": gloo_value,
        "interfaces": [
            {"name": i.name, "up": i.up, "addresses": list(i.addresses)} for i in interfaces
        ],
    }
    problems = nccl_ifname_problems(nccl_value, chosen, interfaces, good, uses_nccl)
    if multi and any(i.name == "lo" for i in chosen):
        problems.append(
            Problem(
                "NCCL would use lo (loopback) but the job spans "
                f"{ctx.plan.nnodes} nodes: other nodes cannot reach it (F14)",
                fix=f"export NCCL_SOCKET_IFNAME={good or '<the NIC between the nodes>'}",
                fatal=uses_nccl,
            )
        )
    if nccl_value is None and multi and len(chosen) > 1:
        odd = [i.name for i in chosen if is_virtual(i.name) or is_link_local_only(i)]
        if odd:
            problems.append(
                Problem(
                    "NCCL_SOCKET_IFNAME is unset and NCCL may pick "
                    f"{', '.join(odd)} (container bridge, veth or link-local), which other "
                    "nodes cannot reach: the job hangs at init (F15)",
                    fix=f"export NCCL_SOCKET_IFNAME={good} GLOO_SOCKET_IFNAME={good}"
                    if good
                    else "set NCCL_SOCKET_IFNAME to the NIC that connects the nodes",
                    fatal=False,
                )
            )
    if gloo_value is not None:
        fix = f"export GLOO_SOCKET_IFNAME={good}" if good else "unset GLOO_SOCKET_IFNAME"
        for message in gloo_problems(gloo_value, interfaces):
            problems.append(Problem(f"GLOO_SOCKET_IFNAME: {message} (F16)", fix=fix))
        if multi and "lo" in [t.strip() for t in gloo_value.split(",")]:
            problems.append(
                Problem(
                    "GLOO_SOCKET_IFNAME names lo but the job spans nodes",
                    fix=f"export GLOO_SOCKET_IFNAME={good or '<the NIC between the nodes>'}",
                )
            )
    names = ", ".join(i.name for i in chosen) or "nothing"
    summary = f"NCCL would use {names} ({rule})"
    if gloo_value is not None:
        summary += f"; gloo uses {gloo_value}"
    details = [
        f"{i.name}: {'up' if i.up else 'DOWN'} {' '.join(i.addresses) or 'no address'}"
        for i in interfaces
    ]
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


@check("nccl.debug_file", "NCCL_DEBUG_FILE")
def nccl_debug_file(ctx: CheckContext) -> CheckOutcome:
    value = setting_value(ctx, "NCCL_DEBUG_FILE")
    if value is None:
        return skipped("unset: NCCL writes its log lines to the ranks' stdout")
    # NCCL expands %h (host name) and %p (pid) in the file name; it never creates directories.
    directory = os.path.dirname(value) or "."
    if "%h" in directory:
        directory = directory.replace("%h", platform.node())  # one directory per host
    facts = {"value": value, "directory": directory}
    problems: list[Problem] = []
    if "%p" in directory:
        problems.append(
            Problem(
                f"NCCL_DEBUG_FILE={value} puts %p (the pid) in the directory: NCCL does not "
                "create directories, so every rank's open fails",
                fix="keep %p in the file name: e.g. NCCL_DEBUG_FILE=/tmp/nccl/%h.%p.log",
                fatal=False,
            )
        )
    else:
        status = ctx.probes.fs.dir_status(directory)
        facts["writable"] = status.writable
        if not status.writable:
            why = status.error or ("not a directory" if status.exists else "does not exist")
            fix = (
                f"mkdir -p {directory}"
                if not status.exists
                else f"choose a writable directory instead of {directory}"
            )
            problems.append(
                Problem(
                    f"NCCL_DEBUG_FILE={value}: {directory} {why}; NCCL cannot open the file and "
                    "writes its log to stdout instead",
                    fix=fix,
                    fatal=False,
                )
            )
    if setting_value(ctx, "NCCL_DEBUG") is None:
        problems.append(
            Problem(
                "NCCL_DEBUG_FILE is set but NCCL_DEBUG is not: NCCL logs nothing",
                fix="export NCCL_DEBUG=INFO (or WARN)",
                fatal=False,
            )
        )
    planned = ctx.plan.nproc_per_node or 1
    if "%p" not in value and planned > 1:
        problems.append(
            Problem(
                f"NCCL_DEBUG_FILE={value} has no %p: the {planned} ranks on this node overwrite "
                "one file",
                fix=f"export NCCL_DEBUG_FILE={os.path.join(os.path.dirname(value) or '.', '%h.%p.log')}",
                fatal=False,
            )
        )
    return outcome_from(problems, ok_summary=f"{value}: {directory} is writable", facts=facts)


@check("nccl.transport", "NCCL transports")
def nccl_transport(ctx: CheckContext) -> CheckOutcome:
    settings = nccl_settings(ctx)
    switches = {
        name: settings[name].value if name in settings else None for name in TRANSPORT_SWITCHES
    }
    hcas = ctx.probes.gpu.infiniband()
    active = [d for d in hcas if d.active]
    facts = {
        "switches": switches,
        "infiniband": [
            {"name": d.name, "ports": [f"{p.number}:{p.state}:{p.link_layer}" for p in d.ports]}
            for d in hcas
        ],
    }
    details = [f"{name}={value}" for name, value in switches.items() if value is not None]
    details.append(
        "InfiniBand/RoCE: "
        + (", ".join(f"{d.name} ({'active' if d.active else 'down'})" for d in hcas) or "none")
    )
    if job_backend(ctx) != "nccl":
        return skipped("NCCL is not used here (no GPU visible: gloo)", details=details, facts=facts)
    problems = transport_problems(ctx, switches, active, [d.name for d in hcas])
    on = [
        "P2P" if not switch_on(switches["NCCL_P2P_DISABLE"]) else None,
        "SHM" if not switch_on(switches["NCCL_SHM_DISABLE"]) else None,
    ]
    if active and not switch_on(switches["NCCL_IB_DISABLE"]):
        on.append(f"IB ({len(active)} active HCA{'s' if len(active) != 1 else ''})")
    summary = f"enabled: {', '.join(x for x in on if x) or 'none'}"
    summary += "; no switches set" if not any(switches.values()) else ""
    return outcome_from(problems, ok_summary=summary, details=details, facts=facts)


# torch 2.8 and later keep a flight recorder for gloo as well as NCCL, dumpable as JSON from inside
# the process (torch._C._distributed_c10d._dump_fr_trace_json); older ones: NCCL only, or none.
FLIGHT_RECORDER_SINCE = (2, 8)
_HOOK_FALLBACK = (
    "ddpdoctor run records every DDP gradient bucket with a Python comm hook instead "
    "(about 80 µs a step)"
)


@check("nccl.flight_recorder", "Flight recorder (collective state for diagnoses)")
def nccl_flight_recorder(ctx: CheckContext) -> CheckOutcome:
    """Which way `ddpdoctor run` learns the state of DDP's gradient all-reduces: PyTorch's flight
    recorder, read on demand (no cost per step), or the Python comm hook (a cost per bucket)."""
    torch = ctx.probes.torch.facts()
    if not torch.installed:
        return skipped("torch is not installed (see gpu.cuda)")
    env = ctx.env
    version = torch.version or "?"
    facts = {"torch": version, "mode": "flight_recorder"}
    forced = env.get("DDPDOCTOR_DDP_BUCKETS", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        facts["mode"] = "python_hook"
        return passed(
            f"DDPDOCTOR_DDP_BUCKETS={forced}: every gradient bucket is recorded by a Python "
            "comm hook (about 80 µs a step; unset it to read the flight recorder instead)",
            facts=facts,
        )
    size = env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "")).strip()
    parsed = _version_tuple(version)
    if parsed is None or parsed < FLIGHT_RECORDER_SINCE:
        facts["mode"] = "python_hook"
        return passed(
            f"not available in torch {version} for gloo and nccl (torch >= 2.8 has it): "
            f"Python hook fallback; {_HOOK_FALLBACK}",
            facts=facts,
        )
    if size == "0":
        facts["mode"] = "python_hook"
        return warning(
            "TORCH_FR_BUFFER_SIZE=0 turns the flight recorder off: Python hook fallback; "
            + _HOOK_FALLBACK,
            fix="unset TORCH_FR_BUFFER_SIZE (ddpdoctor run sets 2000 entries) so that hangs "
            "are diagnosed from the recorder at no cost per step",
            facts=facts,
        )
    return passed(
        f"usable (torch {version}, gloo+nccl): DDP keeps its C++ all-reduce; ddpdoctor reads "
        "the recorder when a rank looks stuck",
        facts=facts,
    )


def _version_tuple(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None
