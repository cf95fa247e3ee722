"""Slurm's compressed host lists and task counts, expanded.

`SLURM_JOB_NODELIST=gpu[01-04,07],login1` names gpu01 gpu02 gpu03 gpu04 gpu07 login1. The grammar
follows Slurm's own parser (src/common/hostlist.c, `hostlist_create`):

- entries are separated by commas (or whitespace) outside brackets;
- a bracket holds comma-separated numbers and `lo-hi` ranges; the width of `lo` sets the zero
  padding (`n[001-003]` -> n001 n002 n003, `n[8-10]` -> n8 n9 n10);
- several brackets in one name expand as a product, leftmost slowest, as Slurm does for names such
  as `rack[0-1]_blade[1-2]` (so `a[1-2]b[3-4]` -> a1b3 a1b4 a2b3 a2b4).

One deliberate difference: Slurm rejects text after the last bracket (`n[001-003]-ib` is an
"invalid hostlist" to `scontrol show hostnames`), while pdsh and ClusterShell accept it. Such a list
can only reach us from a user's own variable, and its meaning is unambiguous, so it is expanded
(n001-ib n002-ib n003-ib) rather than refused.
"""

from __future__ import annotations

import re
from itertools import product

# Slurm refuses ranges larger than this (MAX_RANGE in hostlist.c); so do we, to stay bounded.
MAX_HOSTS = 64 * 1024

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class HostlistError(ValueError):
    """A host list or task count that does not parse; the message quotes the offending text."""


def expand_hostlist(text: str) -> list[str]:
    """All host names of a Slurm host list, in order (duplicates kept, as Slurm keeps them)."""
    hosts: list[str] = []
    for entry in _split_top_level(text):
        hosts.extend(_expand_entry(entry, text))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"host list {text!r} names more than {MAX_HOSTS} hosts")
    return hosts


def first_host(text: str) -> str | None:
    """The first host of a host list without expanding the rest (None for an empty list)."""
    entries = _split_top_level(text)
    if not entries:
        return None
    return _expand_entry(entries[0], text)[0]


def expand_tasks_per_node(text: str) -> list[int]:
    """`SLURM_TASKS_PER_NODE` / `SLURM_STEP_TASKS_PER_NODE`: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        match = _TASKS_ITEM.match(item)
        if not match:
            raise HostlistError(f"tasks per node {text!r}: cannot read {item!r} (want N or N(xM))")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise HostlistError(f"tasks per node {text!r} covers more than {MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def _split_top_level(text: str) -> list[str]:
    """Split at commas and whitespace that are not inside brackets."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            if depth:
                raise HostlistError(f"host list {text!r}: brackets cannot nest")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"host list {text!r}: ']' without '['")
            depth = 0
        elif depth == 0 and (char == "," or char.isspace()):
            if current:
                entries.append("".join(current))
                current = []
            continue
        current.append(char)
    if depth:
        raise HostlistError(f"host list {text!r}: '[' is never closed")
    if current:
        entries.append("".join(current))
    return entries


def _expand_entry(entry: str, whole: str) -> list[str]:
    # "gpu[01-02]-ib" -> [["gpu"], ["01", "02"], ["-ib"]]: each part is a list of choices.
    # Brackets are balanced and unnested here: _split_top_level checked that.
    parts: list[list[str]] = []
    rest = entry
    while rest:
        opening = rest.find("[")
        if opening < 0:
            parts.append([rest])
            break
        if opening:
            parts.append([rest[:opening]])
        closing = rest.index("]", opening)
        parts.append(_expand_bracket(rest[opening + 1 : closing], whole))
        rest = rest[closing + 1 :]
    count = 1
    for choices in parts:
        count *= len(choices)
        if count > MAX_HOSTS:
            raise HostlistError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in product(*parts)]


def _expand_bracket(body: str, whole: str) -> list[str]:
    if not body.strip():
        raise HostlistError(f"host list {whole!r}: empty brackets")
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        lo_text, dash, hi_text = item.partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()):
            raise HostlistError(f"host list {whole!r}: {item!r} is not a number or a lo-hi range")
        lo, hi = int(lo_text), int(hi_text) if dash else int(lo_text)
        if hi < lo:
            raise HostlistError(f"host list {whole!r}: range {item!r} runs backwards")
        if len(values) + hi - lo + 1 > MAX_HOSTS:
            raise HostlistError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(lo_text)  # Slurm pads every number to the width written for the low end
        values.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return values
