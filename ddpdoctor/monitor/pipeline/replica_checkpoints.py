"""`ddpdoctor explain rank-0.pt rank-1.pt`: whether per-rank checkpoints hold the same replica.

Each file is loaded with `torch.load(..., weights_only=True)` (no code from the file runs) on the
CPU; its tensors are found in the state dict itself or one level down (`{"model": ...}`,
`{"state_dict": ...}`, ...), names taken without DDP's `module.` prefix. Two files agree when
every tensor they share is bit for bit the same (compared as bytes: a NaN equals itself, -0.0
differs from 0.0), as DDP keeps replicas. The rank of a file comes from its name (`rank-1.pt`,
`ckpt_rank1.pth`, the last number in it), else from the order given. BatchNorm statistics
(`running_mean`, `running_var`) may differ: each rank's last forward updated its own, and DDP
broadcasts rank 0's only at the next forward.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ddpdoctor.errors import UsageError
from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.protocol import bounded
from ddpdoctor.rank_ranges import named_ranks

SUFFIXES = (".pt", ".pth", ".ckpt")
MAX_CHECKPOINT_BYTES = 8 << 30
NAMES_SHOWN = 6
BN_STATS = frozenset({"running_mean", "running_var"})
_NESTED = ("model", "state_dict", "model_state_dict", "module", "net", "network")
_RANK = re.compile(r"rank[-_]?([0-9]+)", re.IGNORECASE)
_NUMBER = re.compile(r"([0-9]+)")


def is_checkpoint(path: Path) -> bool:
    """A torch.save file by its name and its first bytes (a zip archive or a pickle)."""
    if path.suffix.lower() not in SUFFIXES or not bounded.is_regular(path):
        return False
    try:
        head = bounded.read_bytes(path, 4, whole=False, follow=True)
    except (OSError, ValueError):
        return False
    return head.startswith(b"PK") or head[:1] == b"\x80"


def rank_of(path: Path, index: int) -> int:
    match = _RANK.search(path.stem)
    if match is not None:
        return int(match.group(1))
    numbers = _NUMBER.findall(path.stem)
    return int(numbers[-1]) if numbers else index


def tensors_of(obj: Any, torch: Any) -> dict[str, Any]:
    """The tensors of a state dict (or of the state dict under a usual key), by name."""
    if not isinstance(obj, dict):
        return {}
    flat = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not flat:
        for key in _NESTED:
            inner = obj.get(key)
            if isinstance(inner, dict):
                flat = {str(k): v for k, v in inner.items() if isinstance(v, torch.Tensor)}
                if flat:
                    break
    return {k.removeprefix("module."): v for k, v in flat.items()}


def _load(path: Path, torch: Any) -> dict[str, Any]:
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise UsageError(f"cannot read {path}: larger than {MAX_CHECKPOINT_BYTES >> 30} GiB")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is the user's input
        raise UsageError(f"cannot read {path} as a checkpoint: {type(exc).__name__}") from None
    tensors = tensors_of(obj, torch)
    if not tensors:
        raise UsageError(f"{path}: no tensors found (not a state dict)")
    return tensors


def _same(a: Any, b: Any, torch: Any) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_bytes = [t.reshape(-1).contiguous().view(torch.uint8) for t in (a, b)]  # 0-dim too
    return bool(torch.equal(*as_bytes))


def findings(paths: list[Path]) -> list[Finding]:
    """One finding for the checkpoints given: they agree (info) or which tensors differ."""
    import torch

    loaded = {}
    for index, path in enumerate(paths):
        loaded[rank_of(path, index)] = (path, _load(path, torch))
    if len(loaded) < 2:
        return [
            Finding(
                "replicas.one_checkpoint",
                Severity.INFO,
                "one checkpoint per rank is needed to compare replicas; one was given",
                "Give the checkpoint files of two or more ranks (rank-0.pt rank-1.pt ...).",
            )
        ]
    ranks = sorted(loaded)
    base_rank = ranks[0]
    base = loaded[base_rank][1]
    common = sorted(set.intersection(*(set(t) for _, t in loaded.values())))
    differing: dict[str, list[int]] = {}
    for rank in ranks[1:]:
        other = loaded[rank][1]
        for name in common:
            if not _same(base[name], other[name], torch):
                differing.setdefault(name, []).append(rank)
    files = ", ".join(f"rank {r}: {loaded[r][0].name}" for r in ranks)
    # each rank's last forward updated its BatchNorm statistics from its own batch; DDP would
    # broadcast rank 0's at the next forward: differing there is how DDP works
    stats = [n for n in differing if n.rsplit(".", 1)[-1] in BN_STATS]
    for name in stats:
        del differing[name]
    if not differing:
        aside = (
            f"; {len(stats)} BatchNorm statistics differ, as DDP leaves them between forwards"
            if stats
            else ""
        )
        return [
            Finding(
                "replicas.agreed",
                Severity.INFO,
                f"the checkpoints of {named_ranks(ranks)} hold the same replica: all "
                f"{len(common) - len(stats)} shared tensors bit-identical{aside}",
                "",
                evidence=(Evidence(files),),
            )
        ]
    odd = sorted({r for rs in differing.values() for r in rs})
    names = list(differing)
    shown = ", ".join(names[:NAMES_SHOWN]) + (
        f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    )
    who = (
        f"rank {base_rank} and {named_ranks(odd)}"
        if len(ranks) == 2
        else f"{named_ranks(odd)} (against rank {base_rank})"
    )
    return [
        Finding(
            "replicas.checkpoints_differ",
            Severity.ERROR,
            f"the replicas differ at the end: {len(names)} of {len(common)} shared tensors "
            f"differ between {who} ({shown})",
            "The ranks' models were not identical when saved: some rank wrote its replica "
            "outside the optimizer (a load_state_dict or a scheduler step on some ranks only). "
            "Run the job under `ddpdoctor run` to see the step and the line.",
            ranks=tuple(odd) if len(ranks) > 2 else tuple(ranks),
            evidence=(Evidence(files),),
        )
    ]
