"""System checks: /dev/shm, resource limits, CPU and memory headroom, py-spy and ptrace.

Failure modes F24 (/dev/shm too small or full, stale segments) and F28 (memlock too low for
InfiniBand) in the catalog, plus what ddpdoctor itself needs to show stacks (py-spy, ptrace).
Thresholds are heuristics; each message names the numbers it compared.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, passed, warning, worst
from ddpdoctor.checks.probes.system import PtraceInfo
from ddpdoctor.checks.registry import check
from ddpdoctor.launchers.kubernetes import in_kubernetes

GiB = 1 << 30
MiB = 1 << 20
SHM_DIR = "/dev/shm"
SHM_MIN_MULTI_RANK = 1 * GiB  # NCCL uses ~10 MB per local peer connection; DataLoaders far more
SHM_MIN_ANY = 64 * MiB
DOCKER_DEFAULT_SHM = 64 * MiB  # Docker's and containerd's default, a Kubernetes pod's too
SHM_NEEDS = (
    "what uses it: NCCL's shared-memory transport maps NCCL_BUFFSIZE (4 MiB by default) per "
    "channel for each pair of ranks on the node; each DataLoader worker hands its batches to its "
    "rank through it (prefetch_factor, 2 by default, batches in flight per worker)"
)
DEFAULT_LOCAL_RANKS = 2  # the smoke test's default without GPUs
DEFAULT_WORKERS = 2  # DataLoader workers per rank assumed when --workers is not given
# Open files a rank needs: ~1024 for Python, torch and CUDA libraries; each DataLoader worker
# passes batches as file descriptors under the default sharing strategy (prefetch × tensors);
# each peer a few sockets (gloo pairs, NCCL bootstrap).
NOFILE_BASE = 1024
NOFILE_PER_WORKER = 512
NOFILE_PER_PEER = 4
MEMORY_PER_RANK = 1 * GiB  # a rank with torch imported, before the model and data


def visible_devices(count: int, mask: str | None) -> int:
    """GPUs a process sees: NVML's count narrowed by CUDA_VISIBLE_DEVICES, which CUDA reads up
    to its first invalid entry ("-1" hides every GPU)."""
    if mask is None:
        return count
    visible = 0
    for entry in (e.strip() for e in mask.split(",")):
        if not entry or entry.startswith("-"):
            break
        visible += 1
    return min(visible, count)


def visible_gpus(ctx: CheckContext) -> int:
    """GPUs the ranks will see (the GPU probe's NVML count, narrowed by CUDA_VISIBLE_DEVICES)."""
    try:
        count = ctx.probes.gpu.facts().count
    except Exception:  # noqa: BLE001 - the GPU checks report a broken GPU probe; here it means 0
        count = 0
    return visible_devices(count, ctx.env.get("CUDA_VISIBLE_DEVICES"))


def planned_local_ranks(ctx: CheckContext) -> tuple[int, str]:
    """Ranks on this host and where the number comes from: the plan, the GPUs, or a default."""
    if ctx.plan.nproc_per_node:
        return ctx.plan.nproc_per_node, "planned"
    gpus = visible_gpus(ctx)
    if gpus:
        return gpus, "one per visible GPU"
    return DEFAULT_LOCAL_RANKS, "assumed; pass --nproc"


def workers_per_rank(ctx: CheckContext) -> tuple[int, str]:
    if ctx.options.workers is not None:
        return ctx.options.workers, "planned"
    return DEFAULT_WORKERS, "assumed; pass --workers"


def size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


@check("system.shm", "Shared memory (/dev/shm)", timeout_s=10.0)
def shm(ctx: CheckContext) -> CheckOutcome:
    space = ctx.probes.fs.disk_space(SHM_DIR)
    if space is None:
        return warning(
            f"{SHM_DIR} does not exist: NCCL's shared-memory transport and DataLoader workers "
            "need it",
            fix="Mount a tmpfs on /dev/shm (docker: --ipc=host or --shm-size=8g).",
        )
    ranks, why = planned_local_ranks(ctx)
    segments = ctx.probes.system.shm_segments(SHM_DIR)
    stale = [s for s in segments if not s.in_use]
    facts = {
        "total_bytes": space.total_bytes,
        "free_bytes": space.free_bytes,
        "local_ranks": ranks,
        "stale_segments": [s.name for s in stale],
    }
    sizes = f"{size_text(space.free_bytes)} free of {size_text(space.total_bytes)}"
    outcomes = []
    pod = in_kubernetes(ctx.env)
    default = ""
    if space.total_bytes == DOCKER_DEFAULT_SHM:
        default = " (a container's default)" if pod else " (Docker's default)"
    if (ranks > 1 and space.free_bytes < SHM_MIN_MULTI_RANK) or space.free_bytes < SHM_MIN_ANY:
        fix = (
            "Give the container more shared memory: docker run --shm-size=8g (or "
            "--ipc=host); Kubernetes: an emptyDir with medium: Memory mounted on /dev/shm. "
            "Workarounds: NCCL_SHM_DISABLE=1, fewer DataLoader workers."
        )
        if pod:
            fix = (
                "In the pod spec, mount a memory-backed emptyDir on /dev/shm: volumes: "
                "[{name: dshm, emptyDir: {medium: Memory, sizeLimit: 8Gi}}] and, in the "
                "container, volumeMounts: [{name: dshm, mountPath: /dev/shm}] (it counts "
                "against the container's memory limit). Workarounds: NCCL_SHM_DISABLE=1, "
                "fewer DataLoader workers."
            )
        outcomes.append(
            warning(
                f"{SHM_DIR} has only {sizes}{default} for {ranks} local ranks ({why}): NCCL "
                "fails with 'No space left on device' and DataLoader workers die with 'Bus error'",
                fix=fix,
                details=(SHM_NEEDS,),
            )
        )
    if stale:
        total = sum(s.size for s in stale)
        paths = " ".join(f"{SHM_DIR}/{s.name}" for s in stale)
        shown = ", ".join(s.name for s in stale[:5]) + (" ..." if len(stale) > 5 else "")
        outcomes.append(
            warning(
                f"{len(stale)} stale segment{'s' if len(stale) != 1 else ''} in {SHM_DIR} "
                f"({size_text(total)}) whose owner process is gone: {shown}",
                fix=f"Remove them: rm -f {paths}",
            )
        )
    chosen = worst(outcomes)
    if chosen is not None:
        details = (
            *(o.summary for o in outcomes),
            *(d for o in outcomes for d in o.details),
            f"{SHM_DIR}: {sizes}",
        )
        fix = " ".join(o.fix or "" for o in outcomes).strip()
        return warning(chosen.summary, fix=fix, details=details, facts=facts)
    return passed(f"{sizes} for {ranks} local ranks ({why}); no stale segments", facts=facts)


@check("system.limits", "Resource limits", timeout_s=5.0)
def limits(ctx: CheckContext) -> CheckOutcome:
    lim = ctx.probes.system.limits()
    ranks, _ = planned_local_ranks(ctx)
    workers, workers_why = workers_per_rank(ctx)
    world = ctx.plan.world_size or ranks * (ctx.plan.nnodes or 1)
    needed = NOFILE_BASE + NOFILE_PER_WORKER * workers + NOFILE_PER_PEER * world
    ib = ctx.probes.system.infiniband_devices()
    facts = {
        "nofile_soft": lim.nofile_soft,
        "nofile_hard": lim.nofile_hard,
        "nofile_needed": needed,
        "memlock_soft": lim.memlock_soft,
        "memlock_hard": lim.memlock_hard,
        "infiniband_devices": list(ib),
    }
    nofile = "unlimited" if lim.nofile_soft is None else str(lim.nofile_soft)
    memlock = "unlimited" if lim.memlock_soft is None else size_text(lim.memlock_soft)
    outcomes = []
    if lim.nofile_soft is not None and lim.nofile_soft < needed:
        target = max(needed, 65536)
        if lim.nofile_hard is None or lim.nofile_hard >= target:
            raise_it = f"`ulimit -n {target}` before the launch"
        else:
            raise_it = (
                f"raise the hard limit ({lim.nofile_hard}) in /etc/security/limits.conf "
                f"('* hard nofile {target}'; docker: --ulimit nofile={target}:{target}), "
                f"then `ulimit -n {target}`"
            )
        outcomes.append(
            warning(
                f"open-files limit {lim.nofile_soft} is low: each rank may need ~{needed} "
                f"({workers} DataLoader workers, {workers_why}; {world} peers) — 'Too many open "
                "files' / 'received 0 items of ancdata'",
                fix=f"{raise_it.capitalize()}; or call "
                "torch.multiprocessing.set_sharing_strategy('file_system') in the script.",
            )
        )
    if ib and lim.memlock_soft is not None:
        outcomes.append(
            warning(
                f"locked-memory limit is {memlock} with InfiniBand devices present "
                f"({', '.join(ib)}): NCCL cannot register its buffers ('ibv_reg_mr ... Cannot "
                "allocate memory')",
                fix="Make memlock unlimited: '* soft memlock unlimited' and '* hard memlock "
                "unlimited' in /etc/security/limits.conf (log in again / restart slurmd), or "
                "docker run --ulimit memlock=-1; check it inside the launcher: "
                "srun bash -c 'ulimit -l'.",
            )
        )
    chosen = worst(outcomes)
    details = (
        f"open files: soft {nofile}, hard {lim.nofile_hard or 'unlimited'}; ~{needed} needed",
        f"memlock: {memlock}; InfiniBand devices: {', '.join(ib) or 'none'}",
        "These are this process's limits; a launcher (srun, mpirun, a container) may set others.",
    )
    if chosen is not None:
        fix = " ".join(o.fix or "" for o in outcomes)
        return warning(chosen.summary, fix=fix, details=details, facts=facts)
    ib_note = "InfiniBand present" if ib else "no InfiniBand devices, so not needed"
    return passed(
        f"open files {nofile} (~{needed} needed); memlock {memlock} ({ib_note})",
        details=details,
        facts=facts,
    )


@check("system.cpu", "CPU cores", timeout_s=5.0)
def cpu(ctx: CheckContext) -> CheckOutcome:
    info = ctx.probes.system.cpus()
    cores = info.usable
    if info.quota is not None:
        cores = max(1, min(cores, int(info.quota)))
    ranks, ranks_why = planned_local_ranks(ctx)
    workers, workers_why = workers_per_rank(ctx)
    demand = ranks * (workers + 1)
    omp = _int(ctx.env.get("OMP_NUM_THREADS"))
    facts = {
        "usable_cores": info.usable,
        "online_cores": info.online,
        "cgroup_quota": info.quota,
        "local_ranks": ranks,
        "workers_per_rank": workers,
        "omp_num_threads": omp,
    }
    per_rank = max(1, cores // ranks)
    quota = f" (cgroup quota {info.quota:g})" if info.quota is not None else ""
    if ctx.options.workers is None and ranks <= cores and demand > cores:
        # The worker count is only a guess: judge the ranks alone and say what would fit, rather
        # than warn about a DataLoader setting the job may not use.
        fit = max(0, cores // ranks - 1)
        room = (
            f"up to {fit} DataLoader worker{'s' if fit != 1 else ''} per rank fit"
            if fit
            else "no core to spare for DataLoader workers (num_workers=0 fits)"
        )
        return passed(
            f"{cores} usable cores{quota} for {ranks} ranks ({ranks_why}); {room} "
            "(pass --workers to check yours)",
            facts=facts,
        )
    if demand > cores:
        fewer = max(0, per_rank - 1)
        return warning(
            f"{ranks} ranks ({ranks_why}) × ({workers} DataLoader workers ({workers_why}) + 1) "
            f"= {demand} busy processes on {cores} usable cores{quota}",
            fix=f"Use num_workers={fewer} per rank (or fewer ranks), and OMP_NUM_THREADS="
            f"{per_rank} so each rank's threads fit its {per_rank} core(s).",
            facts=facts,
        )
    if omp is not None and omp * ranks > cores:
        return warning(
            f"OMP_NUM_THREADS={omp} × {ranks} ranks = {omp * ranks} threads on {cores} cores",
            fix=f"Set OMP_NUM_THREADS={per_rank} (cores per rank).",
            facts=facts,
        )
    return passed(
        f"{cores} usable cores{quota} for {ranks} ranks × ({workers} workers + 1) = {demand}",
        facts=facts,
    )


@check("system.memory", "Host memory", timeout_s=5.0)
def memory(ctx: CheckContext) -> CheckOutcome:
    mem = ctx.probes.system.memory()
    ranks, why = planned_local_ranks(ctx)
    needed = ranks * MEMORY_PER_RANK
    facts = {"total_bytes": mem.total_bytes, "available_bytes": mem.available_bytes}
    shown = f"{size_text(mem.available_bytes)} available of {size_text(mem.total_bytes)}"
    if mem.available_bytes < needed or mem.available_bytes < mem.total_bytes * 0.05:
        return warning(
            f"only {shown}: {ranks} ranks ({why}) need at least ~{size_text(needed)} before "
            "any model or data; the OOM killer ends a rank with SIGKILL (exitcode -9)",
            fix="Free memory (stop other jobs), or use fewer ranks / DataLoader workers.",
            facts=facts,
        )
    return passed(shown, facts=facts)


@check("system.pyspy", "py-spy (stack dumps)", timeout_s=10.0)
def pyspy(ctx: CheckContext) -> CheckOutcome:
    info = ctx.probes.system.pyspy(ctx.env.get("PATH"))
    trace = ctx.probes.system.ptrace()
    allowed, why = ptrace_verdict(trace)
    facts: Mapping[str, object] = {
        "path": info.path,
        "version": info.version,
        "ptrace_allowed": allowed,
        "yama_ptrace_scope": trace.yama_scope,
        "cap_sys_ptrace": trace.cap_sys_ptrace,
        "root": trace.is_root,
        "seccomp": trace.seccomp,
    }
    if info.path is None:
        return warning(
            f"py-spy is not installed (not on PATH, nor next to {sys.executable}): ddpdoctor "
            "cannot show where a hung rank is stuck",
            fix="pip install py-spy",
            facts=facts,
        )
    if info.error:
        return warning(
            f"py-spy at {info.path} does not run: {info.error}",
            fix="Reinstall it: pip install --force-reinstall py-spy",
            facts=facts,
        )
    if not allowed:
        return warning(
            f"py-spy {info.version} is installed but may not attach to the ranks: {why}",
            fix="Allow ptrace: run the container with --cap-add SYS_PTRACE, or "
            "`sudo sysctl kernel.yama.ptrace_scope=0`, or run py-spy with sudo.",
            facts=facts,
        )
    return passed(f"py-spy {info.version} ({info.path}); attaching allowed: {why}", facts=facts)


def ptrace_verdict(info: PtraceInfo) -> tuple[bool, str]:
    """Whether py-spy, started by ddpdoctor, may attach to ranks it did not start, and why.

    Yama scope 1 allows tracing only descendants, and the ranks are not py-spy's descendants, so
    it needs CAP_SYS_PTRACE as scopes 2 does; scope 3 forbids attaching until reboot.
    """
    scope = info.yama_scope
    if scope == 3:
        return False, "kernel.yama.ptrace_scope=3 forbids attaching until the next reboot"
    if info.cap_sys_ptrace:
        who = "root with CAP_SYS_PTRACE" if info.is_root else "CAP_SYS_PTRACE"
        return True, who
    if scope in (1, 2):
        return False, (f"kernel.yama.ptrace_scope={scope} and this process lacks CAP_SYS_PTRACE")
    if info.is_root:
        return True, "root (same-user attach; no Yama restriction)"
    return True, "same-user processes (no Yama restriction)"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
