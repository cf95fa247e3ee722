"""The collective smoke test: real ranks on this host run init, barrier, all_reduce, broadcast and
all_gather, each result checked element by element, then an all_reduce bandwidth sweep.

The probe (ddpdoctor/checks/probes/smoke.py) starts and supervises the ranks; this module picks
the rank count and backend and turns what the ranks reported into a result that names the rank,
the step and its error.
"""

from __future__ import annotations

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, failed, passed, skipped
from ddpdoctor.checks.probes.smoke_model import SmokeReport, SmokeRequest, blame
from ddpdoctor.checks.registry import check
from ddpdoctor.checks.system import visible_gpus

SMOKE_CHECK_TIMEOUT_S = 90.0  # the runner's bound; the probe's own deadline is below it
DEFAULT_NPROC_WITHOUT_GPUS = 2


@check("smoke.collectives", "Collectives", timeout_s=SMOKE_CHECK_TIMEOUT_S, slow=True)
def collectives(ctx: CheckContext) -> CheckOutcome:
    if not ctx.options.smoke:
        return skipped("skipped (--no-smoke)")
    probe = ctx.probes.smoke
    if not probe.torch_installed():
        return failed(
            "torch is not installed in this Python, so no rank can start",
            fix="Install PyTorch into this environment (pip install torch).",
        )
    gpus = visible_gpus(ctx)
    backend = ctx.plan.resolved_backend(gpus)
    nproc = ctx.options.nproc or gpus or DEFAULT_NPROC_WITHOUT_GPUS
    if backend == "nccl" and gpus == 0:
        return failed(
            "the nccl backend needs GPUs, but none is visible",
            fix="Use --backend gloo on a machine without GPUs, or make the GPUs visible "
            "(CUDA_VISIBLE_DEVICES, container --gpus all).",
        )
    if backend == "nccl" and nproc > gpus:
        return failed(
            f"{nproc} nccl ranks but only {gpus} visible GPUs: NCCL needs one GPU per rank",
            fix=f"Use --nproc {gpus} (one rank per GPU).",
        )
    budget = min(ctx.options.smoke_timeout_s, SMOKE_CHECK_TIMEOUT_S - 15.0)
    report = probe.run(SmokeRequest.within(budget, nproc=nproc, backend=backend, env=ctx.env))
    return outcome_from_report(report)


def outcome_from_report(report: SmokeReport) -> CheckOutcome:
    """The check's result for what the ranks reported (pure, for tests with recorded reports)."""
    n, backend = report.world_size, report.backend
    facts: dict[str, object] = {
        "backend": backend,
        "world_size": n,
        "elapsed_s": round(report.elapsed_s, 3),
        "pids": list(report.pids()),
        "sweep": [
            {
                "bytes": m.bytes,
                "time_us": round(m.time_s * 1e6, 2),
                "iters": m.iters,
                "algbw_gbps": round(m.algbw_gbps(), 4),
                "busbw_gbps": round(m.busbw_gbps(n), 4),
            }
            for m in report.measurements
        ],
    }
    fault = blame(report)
    if fault is None:
        # One rank moves nothing over the bus (busbw = algbw x 2(n-1)/n = 0): rank by algbw then.
        speed = (lambda m: m.busbw_gbps(n)) if n > 1 else (lambda m: m.algbw_gbps())
        peak = max(report.measurements, key=speed, default=None)
        facts["peak_busbw_gbps"] = round(peak.busbw_gbps(n), 4) if peak else None
        facts["peak_algbw_gbps"] = round(peak.algbw_gbps(), 4) if peak else None
        kind = "busbw" if n > 1 else "algbw (one rank: no bus traffic)"
        bandwidth = (
            f"; all_reduce {kind} up to {speed(peak):.2f} GB/s ({_size(peak.bytes)})"
            if peak
            else ""
        )
        return passed(
            f"{n} {backend} rank{'s' if n != 1 else ''}: barrier, all_reduce, broadcast, all_gather correct"
            f"{bandwidth} ({report.elapsed_s:.1f} s)",
            details=sweep_table(report),
            facts=facts,
        )
    facts.update(culprit_ranks=list(fault.ranks), step=fault.step)
    return failed(
        f"{fault.what} ({n} {backend} ranks)",
        fix=_fix_for(
            fault.step, backend, hung=report.timed_out_step is not None, wrong=_wrong(report)
        ),
        details=fault.details,
        facts=facts,
    )


def sweep_table(report: SmokeReport) -> tuple[str, ...]:
    """The all_reduce sweep as nccl-tests prints it: size, time, algbw, busbw."""
    if not report.measurements:
        return ()
    rows = [f"{'size':>10} {'time':>11} {'algbw':>12} {'busbw':>12}"]
    for m in report.measurements:
        rows.append(
            f"{_size(m.bytes):>10} {m.time_s * 1e6:>8.1f} us "
            f"{m.algbw_gbps():>7.3f} GB/s {m.busbw_gbps(report.world_size):>7.3f} GB/s"
        )
    return tuple(rows)


def _wrong(report: SmokeReport) -> bool:
    return any(r.mismatch for r in report.ranks)


def _fix_for(step: str, backend: str, *, hung: bool, wrong: bool) -> str:
    if wrong:
        if backend == "nccl":
            return (
                "A collective returned wrong data: suspect GPU peer-to-peer. Retry with "
                "NCCL_P2P_DISABLE=1; if that passes, disable PCIe ACS / the IOMMU for P2P or "
                "keep P2P off."
            )
        return "A collective returned wrong data: rerun with -v and report the details."
    if step == "import":
        return "torch does not import in a fresh process: run `python -c 'import torch'` and fix the error shown."
    if step == "init":
        also = " and the GPU / NCCL results" if backend == "nccl" else ""
        return (
            "init_process_group did not complete on 127.0.0.1: check the Network results above "
            f"(loopback, host name){also}; each rank's own error is in the details (-v)."
        )
    if hung:
        return (
            f"A rank stopped answering in {step}. On GPUs, set NCCL_DEBUG=INFO and rerun "
            "`ddpdoctor doctor smoke -v`; check GPU peer-to-peer (NCCL_P2P_DISABLE=1) and "
            "shared memory (NCCL_SHM_DISABLE=1)."
        )
    return (
        f"The rank named above failed in {step}; its own error and output are in the details "
        "(-v). Fix that first: the other ranks' errors follow from it."
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
