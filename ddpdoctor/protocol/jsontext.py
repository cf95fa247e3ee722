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
# read from it is bounded in size, and in nesting by the parser's recursion limit, which is
# turned into the ValueError every reader already handles as "not JSON".
MAX_FILE_BYTES = 64 << 20


def loads(text: str | bytes) -> Any:
    """json.loads, with a document nested too deep for the parser (`[[[[...`) a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def read(path: Any, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The JSON document in a file of a run directory: OSError if it cannot be read, ValueError
    if it is not JSON, nested too deep, or larger than `max_bytes`."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes >> 20} MiB")
    return loads(data)
