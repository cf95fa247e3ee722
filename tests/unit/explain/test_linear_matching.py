"""Every matcher that reads job or log text runs in linear time on any line.

A job can print anything, including one line of a megabyte built to make a regular expression
backtrack: every pattern of the explainers, the monitor, the run-directory protocol and the
stack parsers is fed adversarial lines (the text the pattern looks for, cut short and followed by
a long run of one short unit), and the worst of them is timed on a 16 KiB line. Linear matching
costs well under a millisecond there; quadratic backtracking costs a second. The bound sits in
between with a wide margin both ways, so a loaded machine cannot make it flake.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time

import pytest

from ddpdoctor.explain.catalog import all_rules
from ddpdoctor.explain.classify import classify_line
from ddpdoctor.explain.engine import explain_lines
from ddpdoctor.explain.lines import MAX_MATCH_CHARS
from ddpdoctor.protocol.torchrun_logs import AgentLogParser

AUDITED = ("explain", "monitor", "protocol", "stacks", "tui", "launch")
UNITS = (
    *"aA0 :.,/[]-_=(\t\"'<>",
    *("a.", "a:", "a ", "0.", "a/", "a,", "0 ", "a=", "a-", "[a]", "a[", "0:", "[a]:", ": "),
)
GENERIC_PREFIXES = (
    "",
    "NCCL ",
    "NCCL WARN ",
    "[rank0]: ",
    "[default0]:",
    "Traceback ",
    "E1122 ",
    "torch.",
    '  File "a.py", line ',
    "Error: ",
    "exitcode: ",
    "vm:1:1 [0] NCCL INFO ",
)
SCREEN_CHARS = 512
CONFIRM_CHARS = 16 * 1024
BOUND_S = 0.05  # linear: < 1 ms at 16 KiB; quadratic: ~1 s


def _module_patterns() -> dict[str, re.Pattern[str]]:
    found: dict[str, re.Pattern[str]] = {}
    for sub in AUDITED:
        if sub == "tui":
            pytest.importorskip("textual")
        package = importlib.import_module(f"ddpdoctor.{sub}")
        for info in pkgutil.walk_packages(package.__path__, f"ddpdoctor.{sub}."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                    found.setdefault(f"{info.name}.{name}", value)
    return found


def _prefixes(pattern: re.Pattern[str], examples: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Where a match could start to go wrong: the pattern's own literal words, and lines it
    must recognise cut at their separators (half matched), besides the usual line heads."""
    out = set(GENERIC_PREFIXES)
    for word in _LITERAL.findall(pattern.pattern):
        out.update((word, word + " ", word + ":"))
    for text in examples:
        cuts = [i for i, ch in enumerate(text[:300]) if ch in " :[(=./"]
        out.update(text[: i + 1] for i in cuts[:: max(1, len(cuts) // 12)])
    return tuple(sorted(out))


_LITERAL = re.compile(r"(?<![\\?])[A-Za-z][A-Za-z_ ]{2,}")


def _cases() -> list[tuple[str, re.Pattern[str], tuple[str, ...]]]:
    cases = [(r.id, r.pattern, _prefixes(r.pattern, r.examples)) for r in all_rules()]
    cases += [(name, p, _prefixes(p)) for name, p in _module_patterns().items()]
    return cases


def _cost(pattern: re.Pattern[str], text: str, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        pattern.search(text)
        pattern.match(text)
        best = min(best, time.perf_counter() - start)
    return best


def _line(prefix: str, unit: str, chars: int) -> str:
    return prefix + unit * (chars // len(unit))


def _worst(pattern: re.Pattern[str], prefixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """The three most expensive (prefix, unit) families at screening length."""
    timed = sorted(
        ((_cost(pattern, _line(p, u, SCREEN_CHARS)), p, u) for p in prefixes for u in UNITS),
        reverse=True,
    )
    return [(p, u) for _, p, u in timed[:3]]


def test_every_pattern_matches_in_linear_time():
    slow = []
    for name, pattern, prefixes in _cases():
        for prefix, unit in _worst(pattern, prefixes):
            text = _line(prefix, unit, CONFIRM_CHARS)
            cost = _cost(pattern, text)
            if cost > BOUND_S:  # once more, in case the machine was busy: the best of three
                cost = min(cost, _cost(pattern, text, repeat=2))
            if cost > BOUND_S:
                slow.append(f"{name}: {prefix!r} + {unit!r}*N: {cost * 1000:.0f} ms at 16 KiB")
    assert not slow, "\n".join(slow)


MEGABYTE_LINES = (
    "NCCL " + "a" * 1_000_000,
    "[a]:" * 250_000,
    "[default0]:" + "[a]:" * 250_000,
    "vm:1:1 [0] NCCL INFO " + "a_" * 500_000,
)


@pytest.mark.parametrize("text", MEGABYTE_LINES, ids=range(len(MEGABYTE_LINES)))
def test_a_megabyte_line_is_explained_and_classified_quickly(text):
    start = time.perf_counter()
    explain_lines([text])
    classify_line(text)
    AgentLogParser().feed(text, 1)
    assert time.perf_counter() - start < 2.0


def test_lines_are_cut_to_the_documented_length_before_matching():
    from ddpdoctor.explain.lines import FileContext

    line = FileContext(label=None).make_line("[rank1]: " + "x" * (3 * MAX_MATCH_CHARS), 1)
    assert len(line.text) == MAX_MATCH_CHARS
    assert line.rank == 1  # the head, with its launcher prefix, is what is kept
