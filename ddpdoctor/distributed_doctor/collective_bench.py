"""The cross-node collective check, run on every rank inside the doctor's process group.

1. all_reduce correctness: rank r fills only its own segment of the buffer with a known pattern,
   so after the sum every segment must hold its owner's pattern exactly; a wrong segment names the
   rank whose data did not arrive intact (seen with broken GPU peer-to-peer: no error, wrong sums).
2. all_reduce bandwidth: algbw and busbw as nccl-tests define them.
3. pairwise send/recv: one rank per node, pairs in round-robin rounds (each node in at most one
   pair per round, so pairs do not compete for a node's NIC), every exchange bounded in time; a
   link that times out or runs far below the others is the one to look at.

Every blocking call has a timeout: a dead link costs `pair_timeout_s`, never a hang. After a
timeout gloo closes that pair's connection, which is why results travel back through the store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ddpdoctor.distributed_doctor.bench_model import AllReduceResult, PairResult, RankBench

# A test-only switch that breaks or slows one rank's links, to exercise the timeout and slow-link
# findings with real processes: "silent:rank=1" (rank 1 never answers) or
# "slow:rank=1,seconds=0.5" (rank 1 waits before each answer).
FAULT_ENV = "DDPDOCTOR_TEST_LINK_FAULT"


@dataclass(frozen=True)
class BenchConfig:
    allreduce_bytes: int = 4 << 20
    pair_bytes: int = 4 << 20
    iterations: int = 3
    pair_timeout_s: float = 5.0
    total_timeout_s: float = 60.0


@dataclass(frozen=True)
class LinkFault:
    kind: str  # "silent" or "slow"
    rank: int
    seconds: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LinkFault | None:
        text = env.get(FAULT_ENV)
        if not text:
            return None
        kind, _, rest = text.partition(":")
        fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
        return cls(kind.strip(), int(fields.get("rank", -1)), float(fields.get("seconds", 0)))


def default_config(device_type: str, timeout_s: float) -> BenchConfig:
    """Small buffers on CPU/gloo (seconds matter more than precision), larger ones on GPUs."""
    big = device_type == "cuda"
    return BenchConfig(
        allreduce_bytes=(64 << 20) if big else (4 << 20),
        pair_bytes=(64 << 20) if big else (4 << 20),
        # A healthy link moves these buffers in well under a second, connection setup included;
        # seconds without progress mean a broken link, whatever the join timeout.
        pair_timeout_s=max(1.0, min(5.0, timeout_s / 2)),
        total_timeout_s=max(5.0, timeout_s),
    )


def round_robin(participants: list[int]) -> list[list[tuple[int, int]]]:
    """Rounds in which every pair meets once and no rank is in two pairs of a round (the circle
    method); with an odd count one rank sits out each round."""
    players: list[int | None] = list(participants)
    if len(players) < 2:
        return []
    if len(players) % 2:
        players.append(None)
    n = len(players)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = players[i], players[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def run_bench(
    dist: Any,
    torch: Any,
    *,
    rank: int,
    world: int,
    participants: list[int],
    device: str,
    backend: str,
    group: Any = None,
    config: BenchConfig | None = None,
    fault: LinkFault | None = None,
) -> RankBench:
    config = config or BenchConfig()
    allreduce = _allreduce(dist, torch, rank, world, device, group, config)
    pairs: tuple[PairResult, ...] = ()
    if rank in participants:
        pairs = tuple(_pairs(dist, torch, rank, participants, device, group, config, fault))
    return RankBench(
        rank=rank,
        backend=backend,
        device=device,
        allreduce=allreduce,
        pairs=pairs,
        participants=tuple(participants),
    )


def _allreduce(
    dist: Any, torch: Any, rank: int, world: int, device: str, group: Any, config: BenchConfig
) -> AllReduceResult:
    elements = max(world, config.allreduce_bytes // 4)
    segment = elements // world
    nbytes = elements * 4
    timeout = timedelta(seconds=config.pair_timeout_s)
    try:
        data = torch.zeros(elements, dtype=torch.float32, device=device)
        data[rank * segment : (rank + 1) * segment] = _pattern(torch, rank, segment, device)
        _wait(dist.all_reduce(data, group=group, async_op=True), timeout)
        bad, first = _verify(torch, data, world, segment, device)
        timings = []
        for i in range(config.iterations + 1):  # the first run warms up connections and caches
            _sync(torch, device)
            start = time.perf_counter()
            _wait(dist.all_reduce(data, group=group, async_op=True), timeout)
            _sync(torch, device)
            if i:
                timings.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - a failed collective is the finding
        return AllReduceResult(False, nbytes, error=_one_line(exc))
    return AllReduceResult(not bad, nbytes, min(timings), tuple(bad), first)


def _pattern(torch: Any, rank: int, segment: int, device: str) -> Any:
    # Integers below 2**24 are exact in float32, so the sum is compared exactly.
    base = torch.arange(segment, dtype=torch.float32, device=device).remainder_(97)
    return base.add_(float((rank + 1) * 1000))


def _verify(
    torch: Any, data: Any, world: int, segment: int, device: str
) -> tuple[list[int], str | None]:
    bad: list[int] = []
    first: str | None = None
    for owner in range(world):
        got = data[owner * segment : (owner + 1) * segment]
        want = _pattern(torch, owner, segment, device)
        wrong = (got != want).nonzero()
        if wrong.numel():
            bad.append(owner)
            if first is None:
                index = int(wrong[0].item())
                first = (
                    f"element {owner * segment + index}: expected {float(want[index].item())}, "
                    f"got {float(got[index].item())}"
                )
    tail = data[world * segment :]
    if tail.numel() and bool((tail != 0).any().item()):
        first = first or "elements past the last segment are not zero"
    return bad, first


def _pairs(
    dist: Any,
    torch: Any,
    rank: int,
    participants: list[int],
    device: str,
    group: Any,
    config: BenchConfig,
    fault: LinkFault | None,
) -> list[PairResult]:
    results: list[PairResult] = []
    deadline = time.monotonic() + config.total_timeout_s
    elements = max(1, config.pair_bytes // 4)
    buffer = torch.ones(elements, dtype=torch.float32, device=device)
    probe = torch.ones(1, dtype=torch.float32, device=device)
    timeout = timedelta(seconds=config.pair_timeout_s)
    for round_index, pairs in enumerate(round_robin(participants)):
        mine = next((p for p in pairs if rank in p), None)
        if mine is None:
            continue
        a, b = mine
        if fault and fault.rank == rank and fault.kind == "silent":
            continue  # test switch: this rank never answers, as behind a broken link
        if time.monotonic() > deadline:
            results.append(PairResult(a, b, elements * 4, error="not measured: out of time"))
            continue
        peer = b if rank == a else a
        tag = 1000 + round_index * 2
        try:
            _exchange(dist, probe, rank == a, peer, group, tag, timeout, None)  # connect, warm up
            best = None
            for _ in range(2):
                _sync(torch, device)
                start = time.perf_counter()
                _exchange(dist, buffer, rank == a, peer, group, tag + 1, timeout, fault)
                _sync(torch, device)
                elapsed = time.perf_counter() - start
                best = elapsed if best is None else min(best, elapsed)
            results.append(PairResult(a, b, elements * 4, seconds=best))
        except Exception as exc:  # noqa: BLE001 - a dead link is the finding
            results.append(PairResult(a, b, elements * 4, error=_one_line(exc)))
    return results


def _exchange(
    dist: Any,
    tensor: Any,
    starts: bool,
    peer: int,
    group: Any,
    tag: int,
    timeout: timedelta,
    fault: LinkFault | None,
) -> None:
    """A round trip: the starting rank sends then receives; its peer receives then echoes."""
    if starts:
        _wait(dist.isend(tensor, peer, group=group, tag=tag), timeout)
        _wait(dist.irecv(tensor, peer, group=group, tag=tag), timeout)
        return
    _wait(dist.irecv(tensor, peer, group=group, tag=tag), timeout)
    if fault and fault.kind == "slow" and fault.seconds > 0:
        time.sleep(fault.seconds)  # test switch: a slow link on this rank
    _wait(dist.isend(tensor, peer, group=group, tag=tag), timeout)


def _wait(work: Any, timeout: timedelta) -> None:
    if work is not None and not work.wait(timeout=timeout):
        raise TimeoutError(f"timed out after {timeout.total_seconds():g} s")


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    # gloo prefixes messages with its source location: "[.../unbound_buffer.cc:129] Timed out..."
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return f"{type(exc).__name__}: {first}"[:300]
