"""benchmarks/merge_scale.py measures a merge that works: node 0 follows every other node's ranks
through their summaries, by rows or by events, at their latest step."""

from __future__ import annotations

import pytest

from ddpdoctor.monitor.model.snapshot import RankState
from ddpdoctor.protocol.node_summary import read_node_summary, summary_stamp
from tests.procs import load_script


def _bench():
    return load_script("benchmarks/merge_scale.py")


@pytest.mark.parametrize("rows", [True, False], ids=["rows", "events"])
def test_node_0_follows_every_other_nodes_ranks_at_their_latest_step(tmp_path, rows):
    bench = _bench()
    cluster = bench.Cluster(tmp_path / "run", 32, steps_per_s=2, rows=rows, seconds=4)
    for _ in range(4):
        t = cluster.publish()
        cluster.node0(t)
    remote = range(bench.PER_NODE, 32)
    assert sorted(cluster.merge.via) == list(remote)  # each through its node's summary
    assert sorted(cluster.merge.rowed) == (list(remote) if rows else [])
    views = cluster.state.snapshot(t + 0.95, hang_after=5.0).ranks
    assert [v.step for v in views[bench.PER_NODE :]] == [8] * len(remote)
    assert {v.state for v in views[bench.PER_NODE :]} == {RankState.RUNNING}
    assert len({v.step_time_s for v in views}) > 1  # each rank its own timings


def test_the_benchmark_times_node_0(tmp_path):
    assert _bench().cost_per_rank_s(16, 1) > 0


def test_the_summaries_made_ahead_are_what_each_launcher_published(tmp_path):
    """Both variants come from the same events; replayed, each second is a new file."""
    bench = _bench()
    folder = bench.pregenerate(tmp_path / "cache", 24, 2)
    assert bench.pregenerate(tmp_path / "cache", 24, 2) == folder  # made once
    run = bench.RunDir.create(tmp_path / "run")
    replay = bench.Replay(run, folder, "rows")
    inodes = set()
    for second in (1, 2):
        replay.publish()
        for node in (1, 2):
            summary = read_node_summary(run, node)
            assert summary is not None and summary.seq == second
            assert summary.rows is not None  # routine ranks: rows
            inodes.add(summary_stamp(run, node))
    assert len(inodes) == 4
    events = (folder / "events" / "2" / "node-1").read_text()
    assert '"rows"' not in events and '"collective_end"' in events


def test_node_0_names_a_hung_node_and_its_ranks(tmp_path):
    bench = _bench()
    hang = bench.Hang(node=2, second=4)
    folder = bench.pregenerate(tmp_path / "cache", 32, 12, 1, hang)
    latency, right = bench.hang_latency(32, folder, hang)
    assert right
    assert latency is not None and bench.HANG_AFTER_S <= latency <= bench.HANG_AFTER_S + 1.0
