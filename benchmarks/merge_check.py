"""Node 0's polls at scale, recorded and compared: does a faster merge say exactly what it said?

    python benchmarks/merge_check.py --ranks 2048 --record polls.jsonl [--cache DIR] [--adaptive]
    python benchmarks/merge_check.py --ranks 2048 --compare polls.jsonl [--cache DIR] [--adaptive]

merge_scale.py times node 0; this one checks it. The same simulated summaries (merge_sim.py, with
one node's ranks hanging after a few seconds, so the run holds healthy polls, a wait and a hang)
are merged poll by poll, exactly as merge_scale.py does, and each poll's outcome is written as one
JSON line: the diagnosis (verdict, culprits, stalled ranks, who waits on whom, every finding in
full), the thresholds, and a digest of every rank's view (the whole `RankView.to_json()`, so a
view that differs in any field changes it; the views that differ are listed on a mismatch).

Node 0's clock is the simulation's, so two runs of the same code record the same lines: record
with one version of ddpdoctor (the checkout this file is in, or `PYTHONPATH=/elsewhere`), compare
with another. Exit 0 when every poll is equal, 1 at the first poll that is not (printed), 2 when
the recording is of another size or length, or cannot be read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from merge_scale import HANG_AFTER_S, WARM_UP_S, Cluster
from merge_sim import PER_NODE, Hang, pregenerate

from ddpdoctor.monitor.judge.diagnose import Diagnosis, diagnose
from ddpdoctor.monitor.model.snapshot import Snapshot

HEALTHY_S = 4  # seconds of healthy training after the warm-up, before the hang


def polls(world: int, cache: Path, adaptive: bool = False) -> Iterator[dict[str, Any]]:
    """Every poll of node 0 over the whole simulation, as one JSON-able outcome each (with the
    hang threshold merge_scale.py sets, or adaptive: the job's own, as `ddpdoctor run` has it)."""
    hang = Hang(node=world // PER_NODE // 2, second=WARM_UP_S + HEALTHY_S + 1)
    # the adaptive threshold is ten of the simulation's 1 s steps: give it the time to pass
    total = hang.second + (13 if adaptive else int(HANG_AFTER_S) + 3)
    folder = pregenerate(cache, world, total, 1, hang)
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-check-") as tmp:
        cluster = Cluster(Path(tmp) / "run", world, folder=folder)
        for _ in range(cluster.replay.seconds):
            t = cluster.publish()
            for at in (t + 0.95, t + 1.45):
                cluster.merge.merge(at, cluster.records, final=False)
                snap = cluster.state.snapshot(at, hang_after=None if adaptive else HANG_AFTER_S)
                yield outcome(at, snap, diagnose(snap))


def outcome(at: float, snap: Snapshot, diagnosis: Diagnosis) -> dict[str, Any]:
    views = {
        str(view.rank): hashlib.sha256(
            json.dumps(view.to_json(), sort_keys=True, default=repr).encode()
        ).hexdigest()[:16]
        for view in snap.ranks
    }
    return {
        "at": at,
        "verdict": diagnosis.verdict.value,
        "culprits": sorted(diagnosis.culprits),
        "stalled": sorted(diagnosis.stalled),
        "waiting_on": [[rank, list(on)] for rank, on in diagnosis.waiting_on],
        "waits": [w.to_json() for w in diagnosis.waits],
        "findings": [f.to_json() for f in diagnosis.findings],
        "thresholds": snap.thresholds.to_json() if snap.thresholds else None,
        "views": views,
    }


def _normal(line: dict[str, Any]) -> str:
    return json.dumps(line, sort_keys=True, default=repr)


def compare(recorded: list[dict[str, Any]], now: list[dict[str, Any]]) -> int:
    if len(recorded) != len(now):
        print(
            f"ddpdoctor: error: the recording has {len(recorded)} polls, this run {len(now)}",
            file=sys.stderr,
        )
        return 2
    for i, (old, new) in enumerate(zip(recorded, now, strict=True)):
        if _normal(old) == _normal(new):
            continue
        print(f"poll {i} (t {new['at']:.2f}) differs:")
        for key in sorted(set(old) | set(new)):
            if key == "views":
                differ = sorted(
                    (
                        r
                        for r in set(old[key]) | set(new[key])
                        if old[key].get(r) != new[key].get(r)
                    ),
                    key=int,
                )
                if differ:
                    print(f"  views of {len(differ)} rank(s) differ, the first: {differ[:10]}")
            elif _normal(old.get(key)) != _normal(new.get(key)):
                print(f"  {key}: recorded {_normal(old.get(key))[:400]}")
                print(f"  {' ' * len(key)}  now      {_normal(new.get(key))[:400]}")
        return 1
    verdicts = [line["verdict"] for line in now]
    print(
        f"{len(now)} polls equal ({verdicts.count('running')} running, "
        f"{len(now) - verdicts.count('running')} with a verdict: {sorted(set(verdicts))})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2048)
    parser.add_argument("--cache", type=Path, help="keep the other nodes' summaries here")
    parser.add_argument(
        "--adaptive", action="store_true", help="the adaptive hang threshold, not a fixed 5 s"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--record", type=Path, help="write each poll's outcome here")
    what.add_argument("--compare", type=Path, help="compare each poll with this recording")
    args = parser.parse_args(argv)
    recorded = None
    if args.compare:  # read before the simulation's minutes, not after
        try:
            recorded = [json.loads(text) for text in args.compare.read_text().splitlines()]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(
                f"ddpdoctor: error: cannot read the recording {args.compare}: {exc}",
                file=sys.stderr,
            )
            return 2
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-sim-") as tmp:
        lines = list(polls(args.ranks, args.cache or Path(tmp), args.adaptive))
    if recorded is not None:
        return compare(recorded, [json.loads(_normal(line)) for line in lines])
    args.record.write_text("".join(_normal(line) + "\n" for line in lines))
    verdicts = sorted({line["verdict"] for line in lines})
    print(f"{len(lines)} polls recorded in {args.record} (verdicts: {verdicts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
