"""JSON as ddpdoctor writes it: always valid JSON.

Python's json writes NaN and Infinity by default, which no other JSON reader accepts (jq, browsers,
JavaScript's JSON.parse). A loss that went NaN or a time that overflowed must not make diagnosis.json
or `--json` unreadable: non-finite numbers are written as null, and `allow_nan=False` makes any
that slip through an error here instead of a broken file downstream.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard

from ddpdoctor.protocol import bounded


def finite(value: Any) -> Any:
    """`value` with every NaN / inf float (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """json.dumps that never writes NaN or Infinity (they become null)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def dump(value: Any, fh: Any, **kwargs: Any) -> None:
    fh.write(dumps(value, **kwargs))


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (JSON's true/false load as bool, a subclass of int, and are not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """A JSON number, integer or not (never a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A run directory may come from anywhere (a copy mailed in a bug report, a shared folder): JSON
# read from it is bounded in size (protocol/bounded.py), in nesting, and in its numbers. No writer
# of ddpdoctor's writes NaN, Infinity, a number that overflows a float (1e400) or an integer of
# hundreds of digits, and readers do arithmetic and allocate by the numbers they read, so a
# document holding one is refused as "not JSON", like one nested deeper than MAX_DEPTH.
MAX_FILE_BYTES = bounded.MAX_FILE_BYTES
MAX_DEPTH = 64
MAX_INT_DIGITS = 24  # a nanosecond time or a 64-bit hash fits; a 400-digit "rank" does not


def _parse_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number out of range: {text[:40]}")
    return value


def _parse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder for every document (json.loads with hooks would build a new one per call); its
# hooks cost a call per number. Most documents cannot hold a number the hooks refuse, and
# `loads` checks that on the raw text first (`_outside_strings`, `_suspect`), then parses them
# with json's own C number parsing (`_PLAIN`): node 0 of 4096 nodes reads 2048 summaries a second.
_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
)
_PLAIN = json.JSONDecoder(parse_constant=_parse_constant)
# The text outside strings, as bytes: digits -> "0", e/E -> "e", the rest " " (signs dropped).
_NUMBERS = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else ord(" ")
    for b in range(256)
)
_LONG_DIGITS = b"0" * (MAX_INT_DIGITS + 1)
# (a float overflows only with an exponent of 3 digits or more, or 309 digits before its point)
_LONG_EXPONENT = b"e000"
# The text outside strings, only its brackets, each opening one "(" and each closing one ")".
_BRACKETS = bytes(ord("(") if b in b"[{" else ord(")") if b in b"]}" else b for b in range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Documents up to this many characters are checked on their text; a larger one (a flight
# recorder's dump, a big report) as it was parsed, which needs no copy of its text in pieces.
CHECK_TEXT_MAX = 1 << 20


def loads(text: str | bytes) -> Any:
    """json.loads for text from outside: ValueError for a document nested deeper than MAX_DEPTH,
    one holding NaN/Infinity, a number beyond a float's range, or an integer of more than
    MAX_INT_DIGITS digits; else what json.loads gives."""
    try:
        if isinstance(text, bytes):
            encoding = json.detect_encoding(text)
            raw = text if encoding == "utf-8" else None
            text = text.decode(encoding, "surrogatepass")
        else:
            raw = None
        if len(text) > CHECK_TEXT_MAX:
            outside = None  # (a large document: checked as it is parsed, in less memory)
        else:
            outside = _outside_strings(raw or text.encode("utf-8", "surrogatepass"))
        plain = outside is not None and not _suspect(outside)
        value = (_PLAIN if plain else _DECODER).decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        deepest = _depth(value) if outside is None else _nesting(outside)
        if deepest > MAX_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH}")
    return value


def _outside_strings(raw: bytes) -> bytes:
    """The UTF-8 text of a document with its strings taken out (C-speed passes, no parsing):
    its escaped backslashes and quotes first, then every other part between quotes. What is
    left holds every number and bracket of the document, and nothing a string said."""
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(raw.split(b'"')[::2])


def _suspect(outside: bytes) -> bool:
    """Whether a number the hooks refuse may be in the document: a run of more than
    MAX_INT_DIGITS digits, or an exponent of 3 digits or more (then the hooks decide)."""
    numbers = outside.translate(_NUMBERS, b"+-")
    return _LONG_DIGITS in numbers or _LONG_EXPONENT in numbers


def _nesting(outside: bytes) -> int:
    """How deep containers nest, from the brackets outside strings: each pass takes away every
    innermost pair, so the passes are the depth (at most MAX_DEPTH + 1 of them)."""
    brackets = outside.translate(_BRACKETS, _NOT_BRACKETS)
    depth = 0
    while brackets and depth <= MAX_DEPTH:
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            return MAX_DEPTH + 1  # (not a document json parsed: never here)
        brackets = shorter
        depth += 1
    return depth


def _depth(value: Any) -> int:
    """How deep containers nest in `value` (iterative: never recurses on crafted input)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def read(path: Any, max_bytes: int = MAX_FILE_BYTES, *, root: Any = None) -> Any:
    """The JSON document in a regular file (protocol/bounded.py: never a FIFO or a device, never
    blocking, a symlink followed only to a file inside `root`): OSError if it cannot be read,
    ValueError if it is not JSON, nested too deep, holds a number out of range, or is larger
    than `max_bytes`."""
    return loads(bounded.read_bytes(path, max_bytes, root=root))
