"""Which rules could match a line, found from its words in one pass.

Trying ~90 needles per line (as substrings or as one regex alternation) costs tens of
microseconds; the explainers see every line of logs that can be gigabytes long. Instead each
needle is indexed under one of its words, and a line's words select the few rules worth trying.
A word at the edge of a needle ("atchdog" in "atchdog caught") may be part of a longer word in a
line, so edge words are used only where every example line of the rule has them as whole words;
a needle without such a word is checked as a plain substring.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

_WORD = re.compile(r"\w+")


class Indexable(Protocol):
    """What the index reads of a rule (log_rules.LineRule, which builds on this module)."""

    @property
    def needles(self) -> tuple[str, ...]: ...

    @property
    def examples(self) -> tuple[str, ...]: ...


class TokenIndex:
    def __init__(self, rules: Sequence[Indexable]) -> None:
        self.by_word: dict[str, set[int]] = {}
        self.substrings: list[tuple[str, int]] = []  # needles with no usable word
        for index, rule in enumerate(rules):
            example_words = [set(_WORD.findall(e)) for e in rule.examples]
            for needle in rule.needles:
                word = index_word(
                    needle,
                    [w for w, e in zip(example_words, rule.examples, strict=True) if needle in e],
                )
                if word is None:
                    self.substrings.append((needle, index))
                else:
                    self.by_word.setdefault(word, set()).add(index)
        self.words = frozenset(self.by_word)

    def candidates(self, text: str) -> list[int]:
        """Indexes of the rules whose needles may occur in `text`, in rule order."""
        found: set[int] = set()
        hits = self.words.intersection(_WORD.findall(text))
        for word in hits:
            found |= self.by_word[word]
        for needle, index in self.substrings:
            if needle in text:
                found.add(index)
        return sorted(found)


def index_word(needle: str, examples: Sequence[set[str]]) -> str | None:
    """The longest word of `needle` that is a whole word wherever the needle occurs."""
    best = None
    for match in _WORD.finditer(needle):
        word = match.group()
        interior = match.start() > 0 and match.end() < len(needle)
        whole_in_examples = bool(examples) and all(word in words for words in examples)
        if (interior or whole_in_examples) and (best is None or len(word) > len(best)):
            best = word
    return best
