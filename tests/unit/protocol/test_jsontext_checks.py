"""jsontext.loads: the checks on the raw text (numbers, nesting) refuse what the hooks refuse."""

from __future__ import annotations

import json
import random

import pytest

from ddpdoctor.protocol import jsontext

DEEP = jsontext.MAX_DEPTH

CASES = {
    "[1e400]": True,
    "[1E+400]": True,
    "[-1e400]": True,
    "[1e-400]": False,
    "[1.5e+300]": False,
    "[" + "9" * 24 + "]": False,
    "[" + "9" * 25 + "]": True,
    "[-" + "9" * 24 + "]": False,
    "[" + "1" * 400 + ".5]": True,
    "[NaN]": True,
    "[Infinity]": True,
    '["' + "9" * 40 + '"]': False,  # digits in a string are no number
    '["e+400"]': False,
    "[" * DEEP + "]" * DEEP: False,
    "[" * (DEEP + 1) + "]" * (DEEP + 1): True,
    '["' + "[" * 100 + '"]': False,  # brackets in a string nest nothing
    "[" + '{"a":' * (DEEP - 1) + "1" + "}" * (DEEP - 1) + "]": False,
    "[" + '{"a":' * DEEP + "1" + "}" * DEEP + "]": True,
    # closing brackets in a string, and escaped quotes, never hide a real nesting
    '["]]]]", ' + "[" * DEEP + "]" * DEEP + "]": True,
    '["\\"[[[", ' + "[" * DEEP + "]" * DEEP + "]": True,
    '["\\"]]]", ' + "[" * DEEP + "]" * DEEP + "]": True,
    '["\\\\", "]]", ' + "[" * (DEEP - 1) + "]" * (DEEP - 1) + "]": False,
}


def _refused(text: str | bytes) -> bool:
    try:
        jsontext.loads(text)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("text", list(CASES))
def test_refused_as_before(text: str) -> None:
    for form in (text, text.encode(), text.encode("utf-16")):
        assert _refused(form) is CASES[text]


def _depth(value: object) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def test_random_documents_parse_as_json_does() -> None:
    rng = random.Random(7)
    leaves = [1, -2.5, 1e-5, 10**23, 'a[\\"]{', "\\", '"', "é[", '\\\\"]', True, None, "}}"]

    def make(depth: int, reach: int) -> object:
        if depth >= reach:
            return rng.choice(leaves)
        wide = rng.randrange(1, 3) if reach < 8 else 1  # (a deep one: a chain, a few leaves)
        inner = [make(depth + 1, reach) for _ in range(wide)]
        if rng.random() < 0.5:
            return [*inner, rng.choice(leaves)]
        return {f"k{i}]\\": v for i, v in enumerate(inner)}

    for i in range(300):
        value = make(0, rng.randrange(1, DEEP + 4) if i % 10 == 0 else rng.randrange(1, 8))
        text = json.dumps(value, ensure_ascii=i % 2 == 0)
        if _depth(value) > DEEP:
            assert _refused(text.encode())
        else:
            assert jsontext.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", [t for t in CASES if t.startswith("[")])
def test_a_large_document_is_refused_as_a_small_one(text: str) -> None:
    """Past CHECK_TEXT_MAX characters the checks run on the parsed value (less memory)."""
    padded = '["' + "x" * jsontext.CHECK_TEXT_MAX + '", ' + text[1:]
    assert len(padded) > jsontext.CHECK_TEXT_MAX
    assert _refused(padded.encode()) is CASES[text]
