"""An event's fields as the monitor reads them: every value checked, a value of the wrong type
read as unknown (None, or empty), never trusted. An event file may be torn, crafted or written
by another ddpdoctor version; a row of a node summary is read through the same checks."""

from __future__ import annotations

from typing import Any

from ddpdoctor.monitor.model.snapshot import CallSite


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def p2p_group(group: str, peer: Any) -> str:
    """Point-to-point sequence numbers count per peer, apart from the group's collectives."""
    return f"{group}/p2p/{peer}"


def shapes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    out = []
    for shape in value:
        if isinstance(shape, list) and all(isinstance(d, int) for d in shape):
            out.append(tuple(shape))
    return tuple(out)


def strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(str(v) for v in value if v is not None)


def frame_text(value: Any, *, base: bool) -> str:
    """ "ddp.py:303 DDPStrategy.barrier" from a site's {"file", "line", "function"} ("" if odd)."""
    if not isinstance(value, dict):
        return ""
    file, line, function = value.get("file"), value.get("line"), value.get("function")
    if not isinstance(file, str) or not isinstance(function, str):
        return ""
    if base:
        file = file.replace("\\", "/").rpartition("/")[2]
    return f"{file}:{line if isinstance(line, int) else '?'} {function}"


def location(value: Any) -> str | None:
    """ "train.py:17 in main" from an error event's location (None when absent or odd)."""
    frame = frame_text(value, base=True)
    if not frame:
        return None
    place, _, function = frame.partition(" ")
    return f"{place} in {function}"


def call_site(value: Any) -> CallSite | None:
    """A collective_start's site (the user's frame, via, issuer); None when absent or odd."""
    user = frame_text(value, base=True)
    if not user:
        return None
    line = value.get("line")
    return CallSite(
        user,
        frame_text(value.get("via"), base=False),
        frame_text(value.get("issuer"), base=False),
        file=value["file"],
        line=line if isinstance(line, int) and not isinstance(line, bool) else None,
        deferred=value.get("deferred") is True,
        **_caller(value.get("caller")),
    )


def _caller(value: Any) -> dict[str, Any]:
    text = frame_text(value, base=True)
    if not text:
        return {}
    line = value.get("line")
    return {
        "caller": text,
        "caller_file": value["file"],
        "caller_line": line if isinstance(line, int) and not isinstance(line, bool) else None,
    }


def median(values: list[float]) -> float | None:
    """statistics.median, without its overhead: a rank's means are made again every step.
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ints(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
