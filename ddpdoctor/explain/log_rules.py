"""The small rule engine every explainer module shares.

A `LineRule` recognises one kind of line: a cheap prefilter (`needles`, indexed by word in
prefilter.py), then a precompiled regex. Rules that `emit` turn matching lines into one finding per id (or per distinct
value of `split_by`), with the matching lines as evidence. Rules that do not emit only classify
lines for the live log panel; a stateful `Analyzer` of their module makes the finding instead
(watchdog lines combined across ranks, torchrun's failure table, Python tracebacks).

Two flags let findings explain each other instead of piling up:
- `generic` (a bare NCCL WARN, `NCCL error in:`, a Python exception): not made for a line a
  specific rule recognises, or dropped when a root-cause error of `explained_by` is present.
- `consequence` (a peer closed the connection, a remote process exited): an error on its own, but
  demoted to a warning when a root-cause error is also present.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.prefilter import TokenIndex
from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.rank_ranges import named_ranks

MAX_EVIDENCE = 8  # evidence lines kept per finding (the first ones: where it started)
MAX_SPLITS = 20  # distinct `split_by` values per rule before the rest are folded together

Groups = Mapping[str, str]
Text = str | Callable[[Groups], str]

LEVEL_OF = {Severity.ERROR: "error", Severity.WARNING: "warn", Severity.INFO: "info"}


@dataclass(frozen=True)
class LineRule:
    id: str
    severity: Severity
    pattern: re.Pattern[str]
    needles: tuple[str, ...]  # at least one must occur in the line before the regex runs
    summary: Text = ""
    fix: Text = ""
    emits: bool = True  # False: an analyzer makes the finding; this rule only classifies
    level: str | None = None  # the live log panel's level; defaults from severity
    generic: bool = False
    consequence: bool = False
    explained_by: str | None = None  # generic only: an id prefix whose errors make it redundant
    # A fact line (NCCL version, Init COMPLETE): classified last, explains nothing.
    fact: bool = False
    split_by: str | None = None  # a named group: one finding per distinct value
    rank_groups: tuple[str, ...] = ()  # named groups holding ranks the message names
    examples: tuple[str, ...] = ()  # lines this rule must recognise (checked by the tests)

    @property
    def line_level(self) -> str:
        return self.level or LEVEL_OF[self.severity]


def rule(
    id: str,
    severity: Severity,
    regex: str,
    needles: Iterable[str],
    summary: Text = "",
    fix: Text = "",
    **options,
) -> LineRule:
    return LineRule(
        id=id,
        severity=severity,
        pattern=re.compile(regex),
        needles=tuple(needles),
        summary=summary,
        fix=fix,
        **options,
    )


def render(text: Text, groups: Groups) -> str:
    if callable(text):
        return text(groups)
    try:
        return text.format_map(_Defaulting(groups))
    except (ValueError, IndexError):
        return text


class _Defaulting(dict):
    def __init__(self, groups: Groups) -> None:
        super().__init__({k: v for k, v in groups.items() if v is not None})

    def __missing__(self, key: str) -> str:
        return "?"


@dataclass(frozen=True)
class Candidate:
    """A finding before the engine decides what explains what."""

    finding: Finding
    generic: bool = False
    consequence: bool = False
    explained_by: str | None = None


class Analyzer(Protocol):
    def feed(self, line: SourceLine) -> None: ...

    def end_file(self, file: str | None) -> None: ...

    def finish(self) -> list[Candidate]: ...


@dataclass
class EvidenceList:
    """Evidence lines and ranks gathered for one finding, bounded."""

    lines: list[SourceLine] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    count: int = 0

    def add(self, line: SourceLine, ranks: Iterable[int] | None = None) -> None:
        """`ranks`: the ranks this line points at; None means the rank that wrote the line."""
        self.count += 1
        if len(self.lines) < MAX_EVIDENCE:
            self.lines.append(line)
        if ranks is not None:
            self.ranks.update(ranks)
        elif line.rank is not None:
            self.ranks.add(line.rank)

    def evidence(self) -> tuple[Evidence, ...]:
        """In file order, so evidence reads like the log."""
        ordered = sorted(self.lines, key=lambda line: (line.file or "", line.line_no or 0))
        return tuple(to_evidence(line) for line in ordered)


def to_evidence(line: SourceLine) -> Evidence:
    return Evidence(text=line.evidence_text(), file=line.file, line=line.line_no)


@dataclass
class _Hit:
    rule: LineRule
    groups: dict[str, str]
    evidence: EvidenceList


class RuleTable:
    """Rules compiled once: a word index picks the candidate rules, then each regex in order."""

    def __init__(self, rules: Iterable[LineRule]) -> None:
        ordered = list(rules)
        # Specific rules first, so a generic one is only tried on lines nothing else explained;
        # fact rules last, so an error line that also states a fact is classified as the error.
        self.rules = (
            tuple(r for r in ordered if not r.generic and not r.fact)
            + tuple(r for r in ordered if r.generic)
            + tuple(r for r in ordered if r.fact)
        )
        self.index = TokenIndex(self.rules)

    def matches(self, line: SourceLine) -> Iterator[tuple[LineRule, re.Match[str]]]:
        text = line.text
        explained = False
        for position in self.index.candidates(text):
            candidate = self.rules[position]
            if candidate.generic and explained:
                continue
            if not any(n in text for n in candidate.needles):
                continue
            match = candidate.pattern.search(line.body)
            if match is None:
                continue
            explained = explained or not (candidate.generic or candidate.fact)
            yield candidate, match

    def first_match(self, line: SourceLine) -> LineRule | None:
        for found, _ in self.matches(line):
            return found
        return None

    def explains(self, line: SourceLine) -> bool:
        """Whether a specific explainer recognises this line (facts and benign lines do not)."""
        return any(
            not (found.generic or found.fact or found.id.startswith("benign."))
            for found, _ in self.matches(line)
        )


class RuleSet:
    """The analyzer that turns matching lines into findings, one per rule id (or split value)."""

    def __init__(self, table: RuleTable) -> None:
        self.table = table
        self._hits: dict[tuple[str, str], _Hit] = {}
        self._splits: dict[str, int] = {}

    def feed(self, line: SourceLine) -> None:
        recorded: set[str] = set()
        for found, match in self.table.matches(line):
            if found.emits and found.id not in recorded:  # one line is evidence once per id
                recorded.add(found.id)
                self._record(found, match, line)

    def end_file(self, file: str | None) -> None:
        return None

    def _record(self, found: LineRule, match: re.Match[str], line: SourceLine) -> None:
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        key = groups.get(found.split_by, "") if found.split_by else ""
        hit = self._hits.get((found.id, key))
        if hit is None and key:
            if self._splits.get(found.id, 0) >= MAX_SPLITS:
                key = "…"  # bounded: the rest share one finding
                hit = self._hits.get((found.id, key))
            else:
                self._splits[found.id] = self._splits.get(found.id, 0) + 1
        if hit is None:
            hit = self._hits[(found.id, key)] = _Hit(found, groups, EvidenceList())
        else:
            for name, value in groups.items():
                hit.groups.setdefault(name, value)
        named = [int(groups[g]) for g in found.rank_groups if groups.get(g, "").isdigit()]
        hit.evidence.add(line, named or None)

    def finish(self) -> list[Candidate]:
        out = []
        for hit in self._hits.values():
            groups = dict(hit.groups, count=str(hit.evidence.count))
            finding = Finding(
                id=hit.rule.id,
                severity=hit.rule.severity,
                summary=render(hit.rule.summary, groups),
                fix=render(hit.rule.fix, groups),
                ranks=tuple(sorted(hit.evidence.ranks)),
                evidence=hit.evidence.evidence(),
            )
            out.append(
                Candidate(
                    finding,
                    generic=hit.rule.generic,
                    consequence=hit.rule.consequence,
                    explained_by=hit.rule.explained_by,
                )
            )
        return out


def ranks_text(ranks: Iterable[int]) -> str:
    """ "rank 3" / "ranks 0, 1, 4" / "ranks 0-63"."""
    return named_ranks(ranks, empty="an unknown rank")
