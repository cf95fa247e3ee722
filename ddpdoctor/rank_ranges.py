"""Rank (and node) lists as people read them: consecutive ranks folded into ranges ("0-3, 5");
one formatter for the text, the TUI, the explainers and the distributed doctor."""

from __future__ import annotations

from collections.abc import Iterable


def fold_ranks(ranks: Iterable[int], *, sep: str = ", ", min_run: int = 2, empty: str = "-") -> str:
    """[0, 1, 2, 3, 5] -> "0-3, 5"; runs shorter than `min_run` stay listed ("0, 1" at 3)."""
    ordered = sorted(set(ranks))
    if not ordered:
        return empty
    parts: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        if prev - start + 1 >= min_run:
            parts.append(f"{start}-{prev}")
        else:
            parts.extend(str(r) for r in range(start, prev + 1))
        if rank is not None:
            start = prev = rank
    return sep.join(parts)


def named_ranks(ranks: Iterable[int], noun: str = "rank", *, empty: str | None = None) -> str:
    """ "rank 3" / "ranks 0, 2, 5" / "ranks 0-511" (long runs of consecutive ranks folded), and the
    same for nodes with noun="node". `empty` is said for no rank at all."""
    ordered = sorted(set(ranks))
    if not ordered and empty is not None:
        return empty
    if len(ordered) == 1:
        return f"{noun} {ordered[0]}"
    return f"{noun}s " + fold_ranks(ordered, min_run=3)
