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

import contextlib
import io
import os
import pickle
import re
import resource
import select
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddpdoctor.protocol import bounded, jsontext
from ddpdoctor.protocol.flight_recorder import FrRank, parse_dump

MAX_DUMP_BYTES = 64 << 20  # the default 2000-entry buffer with stacks is a few MB
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json)?$")
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
# items a pickle may expand to per byte of the file (torch's own dumps: well under 1)
EXPANSION = 16
# what loading one pickle may take, on top of what grows with its size (see _load_pickle)
CHILD_CPU_S = 5
CHILD_MEMORY = 512 << 20
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
    """The rank a dump's name ends with (at most 12 digits: a number, not a world to build)."""
    match = _RANK_SUFFIX.search(path.name)
    return int(match.group(1)) if match and len(match.group(1)) <= 12 else None


def _expanded_size(value: Any, budget: int) -> int:
    """How many items `value` holds with every shared reference counted each time it is
    reached: the work any reading of it does. A pickle shares objects through its memo, so a
    2 MB file can hold a list of a million references to one entry of a thousand numbers (a
    billion items to read). Each distinct container is sized once (linear in what the file
    holds); the count stops as soon as it passes `budget`, and a container that holds itself
    (a dump never does) counts as past it."""
    sizes: dict[int, int] = {}
    keep: list[Any] = []  # the containers being sized or sized, alive while their ids are keys
    stack: list[tuple[Any, list[Any] | None]] = [(value, None)]
    while stack:
        item, kids = stack.pop()
        if kids is None:  # first visit: size the containers inside it first
            if type(item) not in _CONTAINERS or id(item) in sizes:
                continue
            kids = [*item.keys(), *item.values()] if type(item) is dict else list(item)
            sizes[id(item)] = -1  # being sized: met again below it, it holds itself
            keep.append(item)
            stack.append((item, kids))
            inside = {id(c): c for c in kids if type(c) in _CONTAINERS and id(c) not in sizes}
            stack.extend((c, None) for c in inside.values())
            continue
        total = 1
        for child in kids:
            size = sizes.get(id(child), 1) if type(child) in _CONTAINERS else 1
            if size < 0:
                return budget + 1  # a cycle
            total += size
        sizes[id(item)] = total
        if total > budget:
            return total
    return max(sizes.get(id(value), 1), 1)


_CONTAINERS = frozenset({dict, list, tuple})


def _load_pickle(data: bytes, path: Path) -> Any:
    """The plain containers of an untrusted pickle, its work bounded. Loading a pickle does what
    its opcodes say: a memo bomb (a million references to one large entry) costs nothing to
    load and everything to read, and a key made of tuples nested twice over at each level costs
    2**depth to hash. So it is loaded in a forked child held to a CPU and a memory limit that
    grow with the file's size, which also checks that the shared references do not expand
    past EXPANSION items a byte, and hands the containers back re-pickled; loading them again
    here costs no more than the child's load, which finished within its limits."""
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise DumpError(f"cannot read {path}: no process to load it in") from None
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child_load(data, write_fd)
    os.close(write_fd)
    try:
        payload = _read_child(read_fd, pid, len(data))
    finally:
        os.close(read_fd)
    if payload is None:
        raise DumpError(
            f"{path}: not a flight-recorder dump (loading it took more time or memory than a "
            "dump of its size can: a crafted pickle)"
        )
    try:
        status, value = _PlainUnpickler(io.BytesIO(payload)).load()
    except Exception:  # noqa: BLE001 - the child's answer cut short
        raise DumpError(f"{path}: not a flight-recorder dump (it could not be loaded)") from None
    if status != "ok":
        raise DumpError(f"{path}: not a flight-recorder dump ({value})")
    return value


def _child_load(data: bytes, write_fd: int) -> None:
    code = 0
    try:
        cpu = CHILD_CPU_S + len(data) // (1 << 20)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        allowed = _address_space() + CHILD_MEMORY + 64 * len(data)
        resource.setrlimit(resource.RLIMIT_AS, (allowed, allowed))
        try:
            raw = _PlainUnpickler(io.BytesIO(data)).load()
            budget = EXPANSION * len(data) + (1 << 16)
            if _expanded_size(raw, budget) > budget:
                answer: tuple[str, Any] = (
                    "error",
                    f"its shared references expand past {EXPANSION} items a byte: a crafted pickle",
                )
            else:
                answer = ("ok", raw)
        except Exception as exc:  # noqa: BLE001 - any failure of an untrusted pickle
            answer = ("error", str(exc)[:300])
        payload = memoryview(pickle.dumps(answer, protocol=4))
        while payload:
            payload = payload[os.write(write_fd, payload) :]
    except BaseException:  # noqa: BLE001 - a child that failed says nothing: refused
        code = 1
    finally:
        os._exit(code)


def _address_space() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read(200).split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 1 << 32


def _read_child(read_fd: int, pid: int, size: int) -> bytes | None:
    """The child's answer, or None when it was killed by its limits or ran out of time."""
    deadline = time.monotonic() + CHILD_CPU_S * 3 + size / (1 << 20)
    chunks: list[bytes] = []
    total, limit = 0, 4 * MAX_DUMP_BYTES
    try:
        while total <= limit:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                return None
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        else:
            return None
    finally:
        _reap(pid)
    return b"".join(chunks)


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def load_dump(path: Path, *, follow: bool = False) -> FrRank:
    """One rank's dump from a file; DumpError when it cannot be read as one.

    Read as any file from outside is (protocol/bounded.py: a regular file, at most
    MAX_DUMP_BYTES); a pickle whose shared references would expand past EXPANSION times its size
    (a memo bomb) is refused before anything reads it."""
    try:
        with bounded.open_regular(path, follow=follow) as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > MAX_DUMP_BYTES:
                raise DumpError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MB, not read")
            data = bounded.read_all(fh, MAX_DUMP_BYTES + 1)
        mtime = st.st_mtime
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MB, not read")
    if data.startswith(_PICKLE_PROTOCOLS):
        raw = _load_pickle(data, path)
    else:
        try:
            raw = jsontext.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise DumpError(
                f"{path}: not a flight-recorder dump (neither pickle nor JSON, or a JSON "
                "document nested too deep or holding numbers out of range)"
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


def is_dump_file(path: Path, *, follow: bool = False) -> bool:
    """A regular file (never a FIFO or a device: protocol/bounded.py) whose first bytes look
    like a dump. `follow`: a path the user named may be a symlink to one."""
    try:
        with bounded.open_regular(path, follow=follow) as stream:
            return looks_like_dump(bounded.read_all(stream, 4096))
    except OSError:
        return False


__all__ = ["DumpError", "is_dump_file", "load_dump", "looks_like_dump", "rank_from_name"]
