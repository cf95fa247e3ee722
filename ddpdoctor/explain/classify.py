"""classify_line: a cheap per-line level and finding id, for the live log panel.

Called on every tailed line, so the common case — a line with none of the explainers' needles —
costs one precompiled prefilter search plus one short fallback regex.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ddpdoctor.explain.catalog import rule_table
from ddpdoctor.explain.lines import FileContext

Level = Literal["error", "warn", "info"]

_PLAIN = FileContext(label=None)
# glog / c10 prefixes ("[E1122 04:12:08.38 ...]", "E1122 04:11:38.07 ...", "[W socket.cpp:401]"),
# Python logging and exception lines. The launcher tags ("[default0]:[rank0]:") are taken once
# and never given back: `(?=(...))\1` is an atomic group, so a line of a million tags costs one
# pass, not one retry of the alternatives per tag.
_FALLBACK = re.compile(
    r"^(?=(?P<tags>(?:\[\w+\]:)*\s*))(?P=tags)(?:"
    r"(?P<error>\[?[EF]\d{4} |\[[EF] |ERROR[:\s]|CRITICAL[:\s]|Traceback \(most recent|"
    r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):)"
    r"|(?P<warn>\[?W\d{4} |\[W |WARNING[:\s]|Warning: |\w*Warning: |\S+:\d+: \w*Warning: )"
    r")"
)


@dataclass(frozen=True)
class LineClass:
    level: Level
    finding_id: str | None  # the explainer that recognised the line; None for benign/unknown


def classify_line(text: str) -> LineClass | None:
    """The line's level and the finding id it belongs to, or None for an ordinary line."""
    line = _PLAIN.make_line(text.rstrip("\r\n"), None)
    found = rule_table().first_match(line)
    if found is not None:
        finding_id = None if found.id.startswith("benign.") else found.id
        return LineClass(level=found.line_level, finding_id=finding_id)  # type: ignore[arg-type]
    fallback = _FALLBACK.match(line.text)
    if fallback is None:
        return None
    return LineClass(level="error" if fallback.group("error") else "warn", finding_id=None)
