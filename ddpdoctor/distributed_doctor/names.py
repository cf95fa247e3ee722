"""The master's name in `doctor --distributed`: what the local checks see, and a name that
resolves late.

In a Kubernetes pod, MASTER_ADDR is often a headless service's name that appears only once the
pods have addresses, seconds after the init containers start. The join retries such a name
until --timeout (join.wait_until_reached); rank 0 runs its local checks before it serves the
store, so its `network.master_addr` may have looked too early. A name check that found the name
unresolvable is run again once the join resolved it: a name that resolves within --timeout is a
pass everywhere in the report, and the note says how long it took.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.runner import run_check_list
from ddpdoctor.distributed_doctor.rank_setup import Setup
from ddpdoctor.launchers.identity import LaunchInfo

# the local checks that look MASTER_ADDR (or the host of tcp://) up
NAME_CHECKS = ("network.master_addr", "rendezvous.init_method")


def checks_env(info: LaunchInfo, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the local checks read. A pod's doctor (PET_*) is one rank per pod, an
    order of its own: RANK=PET_NODE_RANK is not the training's RANK, so the checks read the
    pod's PET_* variables as the plain doctor does there, and name them in what they say."""
    env = dict(os.environ if environ is None else environ)
    if info.launcher == "pet":
        return env
    return {**env, **info.torch_env}


def recheck_names(setup: Setup, local: DoctorReport, name_wait_s: float | None) -> DoctorReport:
    """`local` with its name checks that found no address run again (the join has resolved
    the name since); the others as they were."""
    stale = {r.id for r in local.results if r.id in NAME_CHECKS and _unresolved(r)}
    checks = [c for c in setup.checks if c.id in stale]
    if not checks:
        return local
    fresh = {r.id: r for r in run_check_list(checks, setup.context)}
    results = []
    for result in local.results:
        again = fresh.get(result.id)
        if again is None:
            results.append(result)
            continue
        if again.status is Status.PASS:
            waited = f" for {name_wait_s:.1f} s" if name_wait_s is not None else ""
            note = (
                f"the name did not resolve{waited} at first; it did before --timeout "
                f"({setup.timeout_s:g} s): checked again once it did"
            )
            again = replace(again, details=(*again.details, note))
        results.append(again)
    return DoctorReport.build(results, strict=local.strict, elapsed_s=local.elapsed_s)


def _unresolved(result: CheckResult) -> bool:
    return (
        result.status in (Status.FAIL, Status.WARN, Status.ERROR)
        and "addresses" in result.facts
        and not result.facts.get("addresses")
    )


def unresolved_here(timeout_s: float, why: str) -> str:
    return f"did not resolve on this host (rank 0) within {timeout_s:g} s ({why})"


def unresolved_reason(info: LaunchInfo, problem: str) -> str:
    """Every other rank reached MASTER_ADDR but rank 0 never resolved it within --timeout:
    the launcher on rank 0's node looks it up too (torchrun's store client), so it would fail."""
    return (
        f"{info.addr_var}={info.master_addr} {problem}, though every other rank reached it: "
        "torchrun on this node would fail alike"
    )
