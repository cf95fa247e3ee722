"""Fault-injection specs: `--inject KIND:rank=R[,step=S][,seconds=X]` (DESIGN.md).

Parsed once by the CLI (bad specs are usage errors, exit 2) and again inside each rank of the
reference job, which reads the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpdoctor.errors import UsageError

FAULT_KINDS: dict[str, str] = {
    "hang": "block forever before a collective",
    "crash": "raise an exception",
    "exit": "die without a Python error (os._exit)",
    "slow": "sleep `seconds` (default 0.5) in every step from `step` on: a straggler",
    "mismatch": "issue an extra collective on this rank only",
    "shape": "all_reduce a tensor of another size on this rank",
}

DEFAULT_STEP = 5
DEFAULT_SLOW_SECONDS = 0.5


@dataclass(frozen=True)
class InjectSpec:
    kind: str
    rank: int
    step: int = DEFAULT_STEP
    seconds: float | None = None

    @property
    def text(self) -> str:
        parts = [f"rank={self.rank}", f"step={self.step}"]
        if self.seconds is not None:
            parts.append(f"seconds={self.seconds:g}")
        return f"{self.kind}:{','.join(parts)}"

    def applies(self, rank: int, step: int) -> bool:
        """True at the step where a one-shot fault fires on its rank (slow fires on every later step)."""
        if rank != self.rank:
            return False
        return step >= self.step if self.kind == "slow" else step == self.step

    def check_world(self, world_size: int) -> None:
        if not 0 <= self.rank < world_size:
            raise UsageError(
                f"--inject {self.text}: rank {self.rank} is outside the world "
                f"(world size {world_size}, ranks 0..{world_size - 1})"
            )


MAX_SECONDS = 86400.0  # a day: longer than any fault a run needs to show


def parse_inject(text: str) -> InjectSpec:
    """Parse one spec; every mistake is a UsageError naming the spec and what is wrong."""
    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in FAULT_KINDS:
        known = ", ".join(FAULT_KINDS)
        raise UsageError(f"--inject {text!r}: unknown fault kind {kind!r} (known: {known})")
    if not sep or not rest.strip():
        raise UsageError(f"--inject {text!r}: missing rank (write {kind}:rank=R[,step=S])")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not value:
            raise UsageError(f"--inject {text!r}: {item.strip()!r} is not KEY=VALUE")
        if key not in ("rank", "step", "seconds"):
            raise UsageError(f"--inject {text!r}: unknown key {key!r} (rank, step, seconds)")
        if key in fields:
            raise UsageError(f"--inject {text!r}: {key}= is given twice")
        fields[key] = value
    if "rank" not in fields:
        raise UsageError(f"--inject {text!r}: missing rank=R")
    rank = _int_field(text, "rank", fields["rank"], minimum=0)
    step = _int_field(text, "step", fields.get("step", str(DEFAULT_STEP)), minimum=1)
    seconds: float | None = None
    if "seconds" in fields:
        try:
            seconds = float(fields["seconds"])
        except ValueError:
            raise UsageError(
                f"--inject {text!r}: seconds={fields['seconds']!r} is not a number"
            ) from None
        # nan and inf parse as floats but make no sleep: time.sleep raises on them (and on
        # anything beyond a C double's range of seconds), inside the rank.
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
            raise UsageError(
                f"--inject {text!r}: seconds must be a number from 0 to {MAX_SECONDS:g}"
            )
    elif kind == "slow":
        seconds = DEFAULT_SLOW_SECONDS
    return InjectSpec(kind=kind, rank=rank, step=step, seconds=seconds)


def _int_field(text: str, key: str, value: str, *, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--inject {text!r}: {key}={value!r} is not an integer") from None
    if number < minimum:
        raise UsageError(f"--inject {text!r}: {key} must be >= {minimum}, got {number}")
    return number
