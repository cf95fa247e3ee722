"""The results of the cross-node collective check, as plain data that travels between ranks.

collective_bench.py fills these in on each rank; links.py judges them on rank 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AllReduceResult:
    correct: bool
    nbytes: int
    seconds: float | None = None  # best of the timed iterations on this rank
    bad_ranks: tuple[int, ...] = ()  # ranks whose contribution came back wrong
    first_error: str | None = None  # "element 12: expected 1001.0, got 0.0"
    error: str | None = None  # the collective itself failed or timed out


@dataclass(frozen=True)
class PairResult:
    a: int  # the rank that started the exchange (the lower rank)
    b: int
    nbytes: int
    seconds: float | None = None  # best round trip of nbytes each way
    error: str | None = None

    @property
    def gbps(self) -> float | None:
        """Bytes moved both ways per second, in GB/s (10^9 bytes)."""
        if self.seconds is None or self.seconds <= 0:
            return None
        return 2 * self.nbytes / self.seconds / 1e9


@dataclass(frozen=True)
class RankBench:
    rank: int
    backend: str
    device: str
    allreduce: AllReduceResult
    pairs: tuple[PairResult, ...] = ()  # exchanges this rank took part in
    participants: tuple[int, ...] = ()  # ranks in the pairwise matrix (one per node)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankBench:
        allreduce = dict(data["allreduce"])
        allreduce["bad_ranks"] = tuple(allreduce.get("bad_ranks") or ())
        return cls(
            rank=data["rank"],
            backend=data["backend"],
            device=data["device"],
            allreduce=AllReduceResult(**allreduce),
            pairs=tuple(PairResult(**p) for p in data.get("pairs") or ()),
            participants=tuple(data.get("participants") or ()),
        )


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """nccl-tests' all_reduce figures in GB/s: algbw = bytes / time, busbw = algbw * 2(n-1)/n."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world if world > 1 else algbw
