"""The hang threshold, adapted to the job.

A fixed threshold either flags healthy jobs with long steps or waits minutes on fast ones, so the
default follows what the job has shown so far:

    hang_after = max(floor, STEP_FACTOR × median recent step time,
                     WAIT_FACTOR × longest collective wait that completed during training)

The floor is a few seconds once training runs, and larger before the first training step, when
single-rank work (rank 0 preparing or downloading data while the others wait at a barrier, model
loading) legitimately keeps ranks waiting. `--hang-after` replaces all of this with one number.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from ddpdoctor.monitor.snapshot import Thresholds

HANG_FLOOR_S = 5.0
STARTUP_FLOOR_S = 15.0
STEP_FACTOR = 10.0
WAIT_FACTOR = 1.5
DEFAULT_HEARTBEAT_S = 1.0
# "waiting" (shown, not yet a problem): longer than a few normal collectives, at least a second.
WAITING_FLOOR_S = 1.0
WAITING_FACTOR = 3.0
STALE_FLOOR_S = 5.0
STALE_FACTOR = 5.0


def compute_thresholds(
    *,
    hang_after: float | None,
    step_times: Sequence[float],
    training_waits: Iterable[float],
    all_waits: Sequence[float],
    heartbeat_period: float | None,
    training_started: bool,
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
    typical = _p90(all_waits)
    waiting = max(WAITING_FLOOR_S, WAITING_FACTOR * typical)
    waiting = min(waiting, 0.5 * hang)
    return Thresholds(
        hang_after_s=hang,
        waiting_after_s=waiting,
        heartbeat_stale_s=stale,
        adaptive=adaptive,
        basis=basis,
    )


def _p90(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
