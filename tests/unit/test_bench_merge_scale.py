"""benchmarks/merge_scale.py measures a merge that works: node 0 follows every other node's ranks
through their summaries, by rows or by events, at their latest step."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from ddpdoctor.monitor.model.snapshot import RankState
from tests.procs import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("merge_scale", REPO / "benchmarks/merge_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["merge_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rows", [True, False], ids=["rows", "events"])
def test_node_0_follows_every_other_nodes_ranks_at_their_latest_step(tmp_path, rows):
    bench = _bench()
    cluster = bench.Cluster(tmp_path / "run", 32, steps_per_s=2, rows=rows)
    try:
        for _ in range(4):
            t = cluster.publish()
            cluster.node0(t)
    finally:
        cluster.close()
    assert not cluster.followers.process.is_alive()
    remote = range(bench.PER_NODE, 32)
    assert sorted(cluster.merge.via) == list(remote)  # each through its node's summary
    assert sorted(cluster.merge.rowed) == (list(remote) if rows else [])
    views = cluster.state.snapshot(t + 0.95, hang_after=5.0).ranks
    assert [v.step for v in views[bench.PER_NODE :]] == [8] * len(remote)
    assert {v.state for v in views[bench.PER_NODE :]} == {RankState.RUNNING}
    assert len({v.step_time_s for v in views}) > 1  # each rank its own timings


def test_the_benchmark_times_node_0(tmp_path):
    assert _bench().cost_per_rank_s(16, 1) > 0
