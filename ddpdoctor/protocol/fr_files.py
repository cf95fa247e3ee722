"""Flight-recorder dumps as files: what torch's watchdog writes, and ddpdoctor's own answers.

Three forms are read:

- the pickle torch writes on a watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT / TORCH_FR_DUMP_*) or
  `torch._C._distributed_c10d._dump_fr_trace()`: one file per rank named TORCH_FR_DUMP_TEMP_FILE
  + rank (default /tmp/nccl_trace_rank_<R>); the rank is the number the name ends with, as
  torch's analyzer (flight_recorder/components/loader.py) reads it;
- its JSON form (`_dump_fr_trace_json()`), named the same way, with or without `.json`;
- ddpdoctor's answers, RUN_DIR/flight_recorder/rank-<R>.json ({"rank", "taken_t", "dump"}).

A pickle can run code when it is loaded, and a dump may come from anywhere (attached to an issue):
the unpickler here builds only plain containers, numbers and strings, and refuses anything else.
A dump has no time of its own: the file's modification time stands for it when it falls between
the newest call it records and that call's timeout (plus a minute): the watchdog dumps at the
timeout. A copied or checked-out file has a later time, which then says nothing and is not used.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddpdoctor.protocol.flight_recorder import FrRank, parse_dump

MAX_DUMP_BYTES = 64 << 20  # the default 2000-entry buffer with stacks is a few MB
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json)?$")
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
# slack on top of the newest call's timeout for the time a dump may be written at
_DUMP_SLACK_S = 60.0


class DumpError(ValueError):
    """The file is a dump but cannot be read (a reason for the user)."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: a dump needs nothing more."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dump")


def looks_like_dump(head: bytes) -> bool:
    """Whether a file starting with `head` may be a dump (cheap: the first bytes only)."""
    if head.startswith(_PICKLE_PROTOCOLS):
        return True
    text = head.lstrip()[:4096]
    if not text.startswith(b"{"):
        return False
    raw_dump = b'"entries"' in text or b'"pg_config"' in text
    return raw_dump or (b'"dump"' in text and b'"request_id"' in text)


def rank_from_name(path: Path) -> int | None:
    match = _RANK_SUFFIX.search(path.name)
    return int(match.group(1)) if match else None


def load_dump(path: Path) -> FrRank:
    """One rank's dump from a file; DumpError when it cannot be read as one."""
    try:
        if path.stat().st_size > MAX_DUMP_BYTES:
            raise DumpError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MB, not read")
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror or exc}") from None
    if data.startswith(_PICKLE_PROTOCOLS):
        try:
            raw = _PlainUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - any failure of an untrusted pickle
            raise DumpError(f"{path}: not a flight-recorder dump ({exc})") from None
    else:
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise DumpError(
                f"{path}: not a flight-recorder dump (neither pickle nor JSON)"
            ) from None
    if isinstance(raw, dict) and "dump" in raw and "request_id" in raw:
        return _answer(raw, path)
    rank = rank_from_name(path)
    if rank is None:
        raise DumpError(f"{path}: the file name does not end with the rank (e.g. fr_trace_rank_1)")
    try:
        dump = parse_dump(raw, rank=rank, request_id=str(path))
    except ValueError as exc:
        raise DumpError(f"{path}: {exc}") from None
    timed = [e for e in dump.entries if e.created_t is not None]
    if timed:
        newest = max(timed, key=lambda e: e.created_t or 0.0)
        limit = (newest.timeout_s or 0.0) * 1.5 + _DUMP_SLACK_S
        if 0 <= mtime - (newest.created_t or 0.0) <= limit:
            return replace(dump, taken_t=mtime)
    return dump


def _answer(raw: dict, path: Path) -> FrRank:
    """ddpdoctor's answer file (runtime.flight_recorder writes it)."""
    rank = raw.get("rank")
    if not isinstance(rank, int):
        raise DumpError(f"{path}: a flight-recorder answer without its rank")
    if raw.get("error") or not isinstance(raw.get("dump"), dict):
        return FrRank(rank=rank, request_id=str(raw.get("request_id")), taken_t=0.0,
                      error=str(raw.get("error") or "no dump"))  # fmt: skip
    taken = raw.get("taken_t")
    try:
        return parse_dump(
            raw["dump"],
            rank=rank,
            request_id=str(raw.get("request_id")),
            taken_t=float(taken) if isinstance(taken, int | float) else 0.0,
        )
    except ValueError as exc:
        raise DumpError(f"{path}: {exc}") from None


def is_dump_file(path: Path) -> bool:
    """A regular file whose first bytes look like a dump."""
    try:
        with path.open("rb") as stream:
            return looks_like_dump(stream.read(4096))
    except OSError:
        return False


__all__ = ["DumpError", "is_dump_file", "load_dump", "looks_like_dump", "rank_from_name"]
