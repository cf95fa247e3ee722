"""The SPMD contract: what every rank must build alike, compared across ranks before it is used.

DDP, FSDP2 and DeviceMesh assume that every rank wraps the same modules, holds the same
parameters (names, shapes, dtypes, which ones train) and builds the same meshes; a rank that
differs (`fully_shard` on one more submodule, a parameter frozen on one rank) first shows as a
collective of another size, which gloo aborts on and NCCL hangs in, with nothing that names the
module. So at the first forward of each DDP or FSDP model, and when `init_device_mesh` returns,
each rank writes its contract to the job's own store (the default process group's) and the last
rank to arrive compares them all:

    ddpdoctor/contract/<label>/d/<rank>   a digest of the contract (16 hex digits)
    ddpdoctor/contract/<label>/e/<rank>   the contract itself: [key, value, where] per entry
    ddpdoctor/contract/<label>/n          how many ranks have written theirs (store.add)

No rank ever waits for another: the ranks that arrive earlier go on, and the last one reads the
digests (one multi_get) and, only when they differ, the contracts of one rank per digest. A
difference is a `warning` event of code `spmd.contract_mismatch` written before that rank's
first collective with the model: the first differing unit or parameter on each side, the line
that made it (the `fully_shard` call of its unit, the DDP constructor, the mesh), and the culprit
ranks. The monitor's contract rule turns it into a mismatch verdict.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from ddpdoctor.protocol.events import WARNING
from ddpdoctor.runtime import call_sites, core
from ddpdoctor.runtime.collectives import dtype_name

CODE = "spmd.contract_mismatch"
PREFIX = "ddpdoctor/contract/"
MAX_ENTRIES = 100_000  # a contract longer than this is compared by its first entries
MAX_VALUE = 200
# (file, line, function) of the user's line that made an entry
Where = tuple[str, int, str]
Entry = tuple[str, str, "Where | None"]

ROOT_NAME = "(root)"  # FSDP's root unit's name (fsdp_hooks)
ROOT_UNIT = f"unit {ROOT_NAME}"  # its contract entry: there only while it keeps parameters
_labels: dict[str, int] = {}  # kind -> how many contracts of that kind this rank compared


def user_frame(frame: FrameType | None, depth: int = 64) -> Where | None:
    """The innermost frame of the user's own code at or above `frame`."""
    while frame is not None and depth > 0:
        code = frame.f_code
        if call_sites.kind_of(code.co_filename) == call_sites.USER:
            name = getattr(code, "co_qualname", None) or code.co_name
            return (code.co_filename, frame.f_lineno, name)
        frame = frame.f_back
        depth -= 1
    return None


def caller(skip: int) -> Where | None:
    """The user's line above the caller of this function (never raises)."""
    try:
        return user_frame(sys._getframe(skip + 1))
    except Exception:  # noqa: BLE001
        return None


def next_label(kind: str) -> str:
    """`fsdp1`, `fsdp2`, ... : the n-th contract of a kind on this rank (the same on every rank
    that builds its models in the same order)."""
    n = _labels.get(kind, 0) + 1
    _labels[kind] = n
    return f"{kind}{n}"


def digest(entries: Sequence[Entry]) -> str:
    text = "\n".join(f"{key}={value}" for key, value, _ in entries)
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


def place(where: Where | None) -> str:
    if where is None:
        return "an unknown line"
    file, line, function = where
    return f"{file.replace(chr(92), '/').rpartition('/')[2]}:{line} ({function})"


def exchange(
    rt: core.Runtime,
    label: str,
    title: str,
    entries: Sequence[Entry],
    members: Sequence[int] | None = None,
) -> str | None:
    """Publish this rank's contract over the default process group's store; the last of
    `members` (global ranks: the ranks the model synchronizes with; None: every rank) to arrive
    compares. Returns the mismatch message this rank wrote (None: no difference, not the last
    to arrive, or no process group)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return None
    store = c10d._get_default_store()
    rank = dist.get_rank()
    ranks = list(members) if members is not None else list(range(dist.get_world_size()))
    if rank not in ranks:
        return None
    if members is not None:  # ranks of another group compare their own contracts apart
        label += "/g" + hashlib.sha1(str(ranks).encode(), usedforsecurity=False).hexdigest()[:8]
    message = exchange_on(store, rank, ranks, label, title, entries, rt.wall_clock())
    if message is not None:
        named = message.rpartition("[culprits ")[2].partition(";")[0].split(",")
        culprits = [int(r) for r in named if r.isdigit()]
        rt.emit(WARNING, code=CODE, message=message, details={"label": label, "culprits": culprits})
    return message


def exchange_on(
    store: Any,
    rank: int,
    members: Sequence[int],
    label: str,
    title: str,
    entries: Sequence[Entry],
    now: float,
) -> str | None:
    """exchange() on a given store (the benchmark's): the message when this rank, the last to
    arrive, finds that the contracts differ."""
    entries = list(entries[:MAX_ENTRIES])
    mine = digest(entries)
    prefix = f"{PREFIX}{label}/"
    store.set(f"{prefix}e/{rank}", encode(entries))
    store.set(f"{prefix}d/{rank}", mine)
    world = len(members)
    if int(store.add(f"{prefix}n", 1)) != world or world < 2:
        return None
    digests = [b.decode() for b in store.multi_get([f"{prefix}d/{r}" for r in members])]
    if all(d == mine for d in digests):
        return None
    sides: dict[str, list[int]] = {}
    for r, d in zip(members, digests, strict=True):
        sides.setdefault(d, []).append(r)
    reference = max(sides, key=lambda d: (len(sides[d]), d == digests[0]))
    ref_entries = _entries(store, f"{prefix}e/{sides[reference][0]}")
    parts: list[str] = []
    culprits: list[int] = []
    first_where: Where | None = None
    for d, ranks in sides.items():
        if d == reference:
            continue
        other = _entries(store, f"{prefix}e/{ranks[0]}")
        text, blame_other, where = describe_difference(sides[reference], ref_entries, ranks, other)
        parts.append(text)
        tie = len(sides) == 2 and len(ranks) == len(sides[reference])
        if not tie or blame_other is True:
            culprits.extend(ranks)  # the minority, or the side that added or froze something
        elif blame_other is False:
            culprits.extend(sides[reference])
        else:
            culprits.extend([*ranks, *sides[reference]])
            text += " (as many ranks on each side, and nothing tells which one left: both named)"
            parts[-1] = text
        first_where = first_where or where
    culprits = sorted(set(culprits))
    line = f"; line {first_where[0]}:{first_where[1]}" if first_where else ""
    message = (
        f"the ranks differ in the SPMD contract of {title}: " + "; ".join(parts)
        + f" [culprits {','.join(map(str, culprits))}{line}; t {now:.3f}]"
    )  # fmt: skip
    return message


def encode(entries: Sequence[Entry]) -> str:
    """A contract as JSON: the distinct lines once, each entry [key, value, index of its line]."""
    wheres: dict[Any, int] = {}
    rows = []
    for key, value, where in entries:
        index = wheres.setdefault(where, len(wheres))
        rows.append((key, value, index))
    return json.dumps({"where": list(wheres), "entries": rows})


def _entries(store: Any, key: str) -> list[Entry]:
    out: list[Entry] = []
    try:
        doc = json.loads(store.get(key))
        wheres = [tuple(w) if isinstance(w, list) and len(w) == 3 else None for w in doc["where"]]
        for name, value, index in doc["entries"]:
            where = wheres[index] if 0 <= index < len(wheres) else None
            out.append((str(name), str(value), where))
    except Exception:  # noqa: BLE001 - a contract that cannot be read is compared as empty
        pass
    return out


def describe_difference(
    ref_ranks: list[int], ref: list[Entry], other_ranks: list[int], other: list[Entry]
) -> tuple[str, bool | None, Where | None]:
    """(what differs, whether the other side is the odd one where a tie must be broken: True
    for the side that added a unit or parameter or froze one, None when nothing tells, the line).

    The cause is named before its consequences: a unit only one side wrapped also changes the
    parameter count of the unit above it (its parent keeps fewer parameters, or, for the root,
    none: the root then has no unit), so an entry only one side has comes first, then a frozen
    parameter, then any other value."""
    mine = f"rank {other_ranks[0]}" if len(other_ranks) == 1 else f"ranks {other_ranks}"
    theirs = f"rank {ref_ranks[0]}" if len(ref_ranks) == 1 else f"ranks {ref_ranks}"
    ref_map = {key: (value, where) for key, value, where in ref}
    other_map = {key: (value, where) for key, value, where in other}
    added = [(k, v, w) for k, v, w in other if k not in ref_map]
    missing = [(k, v, w) for k, v, w in ref if k not in other_map]
    # A unit wrapped on one side alone can take the root's last parameters: that side's root
    # has no unit left, a consequence of the wrap, not a second difference.
    if added and missing and all(key == ROOT_UNIT for key, _, _ in missing):
        missing = []
    elif added and missing and all(key == ROOT_UNIT for key, _, _ in added):
        added = []
    if added and not missing:
        key, value, where = added[0]
        return f"{mine} has {key} ({value}) made at {place(where)}; {theirs} not", True, where
    if missing and not added:
        key, value, where = missing[0]
        return f"{theirs} has {key} ({value}) made at {place(where)}; {mine} not", False, where
    if added and missing:  # each side made something the other did not: nothing tells
        key, value, where = added[0]
        other_key, other_value, other_where = missing[0]
        text = (
            f"{mine} has {key} ({value}) made at {place(where)}, {theirs} has {other_key} "
            f"({other_value}) made at {place(other_where)}: each side made what the other did not"
        )
        return text, None, where
    changed = [(k, v, w) for k, v, w in other if ref_map[k][0] != v]
    for key, value, where in changed:
        known = ref_map[key][0]
        if ("frozen" in value.split()) != ("frozen" in known.split()):
            text = f"{key}: {mine} {value}, {theirs} {known} (made at {place(where)})"
            return text, "frozen" in value.split(), where
    if changed:
        key, value, where = changed[0]
        text = f"{key}: {mine} {value}, {theirs} {ref_map[key][0]} (made at {place(where)})"
        return text, None, where
    return f"{mine} and {theirs} list the same entries in another order", None, None


def compare(
    rt: core.Runtime | None,
    kind: str,
    title: str,
    entries: Sequence[Entry],
    members: Sequence[int] | None = None,
) -> None:
    """exchange(), never raising: the contract is a check, never a reason to stop training."""
    if rt is None:
        return
    try:
        exchange(rt, next_label(kind), title, entries, members)
    except Exception:  # noqa: BLE001
        pass


def shape_text(shape: Any) -> str:
    return str([int(n) for n in shape])


def param_entries(named: Any, where_of: Any, prefix: str = "param ") -> list[Entry]:
    """One entry per parameter: name -> `[shape] dtype grad|frozen`, made where `where_of(name)`
    says (its unit's fully_shard line, the DDP constructor). ~2 µs a parameter."""
    out: list[Entry] = []
    append = out.append
    for name, param in named:
        state = " grad" if param.requires_grad else " frozen"
        value = f"{list(param.shape)} {dtype_name(param.dtype)}{state}"
        append((prefix + name, value, where_of(name)))
        if len(out) >= MAX_ENTRIES:
            break
    return out


def mesh_text(mesh: Any) -> str:
    names = getattr(mesh, "mesh_dim_names", None)
    dims = ",".join(names) if names else "-"
    return f"{mesh.device_type} mesh {shape_text(mesh.shape)} dims {dims}"[:MAX_VALUE]
