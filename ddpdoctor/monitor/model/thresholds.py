"""The hang threshold, adapted to the job.

A fixed threshold either flags healthy jobs with long steps or waits minutes on fast ones, so the
default follows what the job has shown so far:

    hang_after = max(floor, STEP_FACTOR × median recent step time,
                     WAIT_FACTOR × longest collective wait that completed during training)

A wait whose culprits are all *blocked* (progress.py: no CPU, no I/O and the very same frame, for
about as long as the others have waited) is a hang sooner, past

    hang_blocked_after = max(BLOCKED_FLOOR_S, BLOCKED_PERIODS × heartbeat period,
                             STEP_FACTOR × median step, WAIT_FACTOR × longest normal wait)

since that is evidence, not only time: nothing on the rank moved while the others waited. A busy,
undecided or silent culprit still takes hang_after. The floor is a few seconds once training runs, and larger before the first training step, when
single-rank work (rank 0 preparing or downloading data while the others wait at a barrier, model
loading) legitimately keeps ranks waiting. `--hang-after` replaces all of this with one number.

The hang threshold only applies to ranks waiting for a *blocked* rank (ddpdoctor.monitor.model.progress).
Ranks waiting for a busy one are a wait: shown from `waiting_after`, a warning past

    wait_warn_after = max(hang_after, min(WAIT_WARN_FLOOR_S, WAIT_WARN_FRACTION × pg_timeout))

and an error past WAIT_ERROR_FRACTION × pg_timeout, where pg_timeout is the process group's own
timeout (`init_process_group(timeout=...)`, else torch's default: NCCL 10 min, gloo 30 min), at
which torch itself fails the waiting ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from ddpdoctor.monitor.model.snapshot import Thresholds

HANG_FLOOR_S = 5.0
# Blocked culprits: two idle heartbeat intervals make "blocked" (progress.BLOCKED_INTERVALS), so a
# floor of 2.5 heartbeat periods leaves the evidence half a period to cover the whole wait.
BLOCKED_FLOOR_S = 2.5
BLOCKED_PERIODS = 2.5
STARTUP_FLOOR_S = 15.0
STEP_FACTOR = 10.0
WAIT_FACTOR = 1.5
DEFAULT_HEARTBEAT_S = 1.0
# "waiting" (shown, not yet a problem): longer than a few normal collectives, at least a second.
WAITING_FLOOR_S = 1.0
WAITING_FACTOR = 3.0
STALE_FLOOR_S = 5.0
STALE_FACTOR = 5.0
# torch's default process-group timeouts (torch.distributed's _get_default_timeout)
DEFAULT_PG_TIMEOUT_S = {"nccl": 600.0, "gloo": 1800.0}
FALLBACK_PG_TIMEOUT_S = 600.0  # backend unknown: the shorter default, so the countdown is safe
WAIT_WARN_FLOOR_S = 60.0
WAIT_WARN_FRACTION = 0.5
WAIT_ERROR_FRACTION = 0.8


def pg_timeout(
    recorded: float | None, backend: str | None, *, given: bool = False
) -> tuple[float, str]:
    """(seconds, how it is known) of the process group's timeout."""
    name = (backend or "").lower()
    if recorded is not None and recorded > 0:
        if given:
            return recorded, "init_process_group(timeout=...)"
        return recorded, f"torch's default for {name}" if name else "torch's default"
    if name in DEFAULT_PG_TIMEOUT_S:
        return DEFAULT_PG_TIMEOUT_S[name], f"torch's default for {name}"
    return FALLBACK_PG_TIMEOUT_S, "torch's NCCL default (backend not known yet)"


def compute_thresholds(
    *,
    hang_after: float | None,
    step_times: Sequence[float],
    training_waits: Iterable[float],
    all_waits: Sequence[float],
    heartbeat_period: float | None,
    training_started: bool,
    pg_timeout_s: float | None = None,
    pg_timeout_given: bool = False,
    backend: str | None = None,
) -> Thresholds:
    period = heartbeat_period if heartbeat_period and heartbeat_period > 0 else DEFAULT_HEARTBEAT_S
    # Generous: a heartbeat thread starved on a loaded machine must not read as a dead rank.
    stale = max(STALE_FLOOR_S, STALE_FACTOR * period)
    if hang_after is not None:
        hang = hang_after
        basis = f"--hang-after {hang_after:g} s"
        adaptive = False
    else:
        floor = max(HANG_FLOOR_S if training_started else STARTUP_FLOOR_S, 3.0 * period)
        median_step = statistics.median(step_times) if step_times else 0.0
        longest_wait = max(training_waits, default=0.0)
        candidates = [
            (floor, "floor" if training_started else "startup floor"),
            (STEP_FACTOR * median_step, f"{STEP_FACTOR:g} × median step time {median_step:.2f} s"),
            (
                WAIT_FACTOR * longest_wait,
                f"{WAIT_FACTOR:g} × longest normal wait {longest_wait:.2f} s",
            ),
        ]
        hang, basis = max(candidates, key=lambda c: c[0])
        basis = f"{hang:.1f} s = {basis}"
        adaptive = True
        if training_started:
            blocked_floor = max(BLOCKED_FLOOR_S, BLOCKED_PERIODS * period)
            blocked = max(blocked_floor, *(value for value, _ in candidates[1:]))
            if blocked < hang:
                basis += f"; {blocked:.1f} s when every rank behind is blocked"
    if hang_after is not None or not training_started:
        blocked = hang
    typical = _p90(all_waits)
    waiting = max(WAITING_FLOOR_S, WAITING_FACTOR * typical)
    waiting = min(waiting, 0.5 * hang)
    timeout, timeout_basis = pg_timeout(pg_timeout_s, backend, given=pg_timeout_given)
    warn = max(hang, min(WAIT_WARN_FLOOR_S, WAIT_WARN_FRACTION * timeout))
    error = max(warn, WAIT_ERROR_FRACTION * timeout)
    return Thresholds(
        hang_after_s=hang,
        waiting_after_s=waiting,
        heartbeat_stale_s=stale,
        adaptive=adaptive,
        basis=basis,
        pg_timeout_s=timeout,
        pg_timeout_basis=timeout_basis,
        wait_warn_after_s=warn,
        wait_error_after_s=error,
        hang_blocked_after_s=min(blocked, hang),
        heartbeat_period_s=period,
    )


def _p90(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
