"""How many ranks this host can hold, so `run --nproc 100000` is refused before torchrun starts a
hundred thousand processes (and the machine with them).

The limits are generous on purpose: oversubscribing CPU cores a few times is normal for CPU jobs
and tests, so only counts no job could run with are refused, each with the number that refused it.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from ddpdoctor.errors import UsageError

RANKS_PER_CORE = 16  # a rank mostly waiting on collectives is cheap; sixteen per core is not
MIN_CORE_LIMIT = 32
RANK_MEMORY_BYTES = 100 << 20  # the least a rank needs (Python + torch + gloo: 200 MiB or more)
FILES_PER_RANK = 4  # torchrun holds a rank's stdout and stderr logs and their tee readers
FILES_BASE = 64  # torchrun's own descriptors
GIB = 1 << 30


@dataclass(frozen=True)
class HostCapacity:
    cores: int  # usable by this process (affinity)
    available_bytes: int | None
    max_user_processes: int | None  # RLIMIT_NPROC soft limit; None: unlimited
    max_open_files: int | None  # RLIMIT_NOFILE soft limit; None: unlimited

    @classmethod
    def here(cls) -> HostCapacity:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        try:
            import psutil

            available: int | None = int(psutil.virtual_memory().available)
        except Exception:  # noqa: BLE001 - without a memory figure the other limits still apply
            available = None
        return cls(
            cores=cores,
            available_bytes=available,
            max_user_processes=_soft_limit(resource.RLIMIT_NPROC),
            max_open_files=_soft_limit(resource.RLIMIT_NOFILE),
        )


def _soft_limit(which: int) -> int | None:
    soft, _hard = resource.getrlimit(which)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def rank_limits(capacity: HostCapacity, workers: int = 0) -> list[tuple[int, str]]:
    """(the most local ranks, why) for each limit of this host that applies."""
    limits = [
        (
            max(MIN_CORE_LIMIT, capacity.cores * RANKS_PER_CORE),
            f"{capacity.cores} usable CPU cores (at most {RANKS_PER_CORE} ranks a core)",
        )
    ]
    if capacity.available_bytes is not None:
        limits.append(
            (
                max(1, capacity.available_bytes // RANK_MEMORY_BYTES),
                f"{capacity.available_bytes / GIB:.1f} GiB of memory available "
                f"(at least {RANK_MEMORY_BYTES >> 20} MiB a rank)",
            )
        )
    if capacity.max_user_processes is not None:
        per_rank = 1 + max(0, workers)
        limits.append(
            (
                max(0, capacity.max_user_processes // per_rank - 1),
                f"a limit of {capacity.max_user_processes} processes (ulimit -u) for "
                f"{per_rank} process(es) a rank",
            )
        )
    if capacity.max_open_files is not None:
        limits.append(
            (
                max(0, (capacity.max_open_files - FILES_BASE) // FILES_PER_RANK),
                f"a limit of {capacity.max_open_files} open files (ulimit -n) for torchrun, "
                f"{FILES_PER_RANK} a rank",
            )
        )
    return limits


def check_nproc(nproc: int, capacity: HostCapacity, workers: int = 0) -> None:
    """A UsageError naming every limit `nproc` local ranks exceed."""
    exceeded = [(limit, why) for limit, why in rank_limits(capacity, workers) if nproc > limit]
    if not exceeded:
        return
    most = min(limit for limit, _ in exceeded)
    reasons = "; ".join(f"{why}: at most {limit}" for limit, why in exceeded)
    raise UsageError(
        f"--nproc {nproc} is more ranks than this host can hold ({reasons}): "
        f"use --nproc {most} or fewer"
    )
