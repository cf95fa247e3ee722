"""benchmarks/runtime_hotpath.py's interval of the median difference: the figure a target is
judged by, so it must cover the true median, narrow with more rounds, and say when it cannot."""

from __future__ import annotations

import random

from tests.procs import load_script

hotpath = load_script("benchmarks/runtime_hotpath.py")


def _variants(diffs: list[float]) -> tuple[object, object]:
    ref = hotpath.Variant("plain", runtime=False, wall=[1000.0] * len(diffs))
    full = hotpath.Variant("runtime", runtime=True, wall=[1000.0 + d for d in diffs])
    return full, ref


def _bounds(text: str) -> tuple[float, float]:
    low, high = text.split(" .. ")
    return float(low), float(high)


def test_the_interval_covers_the_median_and_narrows_with_rounds() -> None:
    rng = random.Random(7)
    widths = []
    for rounds in (30, 300):
        # skewed like a shared machine's rounds: a true median of 17 µs, a long right tail
        diffs = [
            17.0 + rng.gauss(0, 60) + rng.expovariate(1 / 40) - 40 * 0.693 for _ in range(rounds)
        ]
        full, ref = _variants(diffs)
        low, high = _bounds(hotpath.median_interval(full, ref, "wall"))
        assert low <= sorted(diffs)[rounds // 2] <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2  # ten times the rounds: about a third of the width


def test_the_interval_is_made_of_the_rounds_own_differences() -> None:
    diffs = [float(d) for d in range(1, 101)]  # 1 .. 100 µs, shuffled
    random.Random(3).shuffle(diffs)
    full, ref = _variants(diffs)
    # n = 100: k = int((100 - 19.6) / 2) = 40, so the 40th and the 61st smallest
    assert hotpath.median_interval(full, ref, "wall") == "+40.0 .. +61.0"


def test_too_few_rounds_say_so() -> None:
    full, ref = _variants([5.0, 6.0, 7.0])
    assert hotpath.median_interval(full, ref, "wall") == "too few rounds for an interval"
