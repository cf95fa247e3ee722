"""Cross-rank comparison, report merging and link judging, on recorded facts from every rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.distributed_doctor.bench_model import (
    AllReduceResult,
    PairResult,
    RankBench,
    bus_bandwidth,
)
from ddpdoctor.distributed_doctor.collective_bench import LinkFault, round_robin
from ddpdoctor.distributed_doctor.consistency import (
    check_consistency,
    check_env,
    check_gpus,
    check_hostnames,
    check_ifname,
    check_master_addr,
    check_versions,
    describe_values,
    nccl_ifname_matches,
)
from ddpdoctor.distributed_doctor.facts import RankFacts, compared_env
from ddpdoctor.distributed_doctor.links import judge_allreduce, judge_links, merge_pairs
from ddpdoctor.distributed_doctor.merge import merge_reports
from ddpdoctor.distributed_doctor.nodes import Member, NodeMap
from ddpdoctor.rank_ranges import fold_ranks

VERSIONS = {
    "torch": "2.14.1+cu130",
    "cuda": "13.0",
    "nccl": "2.30.7",
    "driver": "580.95.05",
    "python": "3.11.7",
    "ddpdoctor": "0.1.0",
}


def rank_facts(rank: int, host: str, node_rank: int | None, **changes) -> RankFacts:
    """One rank of a healthy 2-node × 2-GPU job (gpu07, gpu08) as collect_rank_facts records it."""
    base = RankFacts(
        rank=rank,
        local_rank=rank % 2,
        node_rank=node_rank,
        host=host,
        pid=4000 + rank,
        boot_id=f"boot-{host}",
        versions=dict(VERSIONS),
        env={
            "MASTER_ADDR": "gpu07",
            "MASTER_PORT": "29500",
            "WORLD_SIZE": "4",
            "NCCL_SOCKET_IFNAME": "ib",
            "NCCL_DEBUG": "WARN",
        },
        interfaces=("eth0", "ib0", "lo"),
        gpu_uuid=f"GPU-{host}-{rank % 2}",
        master_addr="gpu07",
        master_resolved=("10.0.0.7",),
        master_connect_ms=0.4 + rank / 10,
    )
    return replace(base, **changes)


def healthy() -> list[RankFacts]:
    return [
        rank_facts(0, "gpu07", 0),
        rank_facts(1, "gpu07", 0),
        rank_facts(2, "gpu08", 1),
        rank_facts(3, "gpu08", 1),
    ]


def node_map(facts: list[RankFacts]) -> NodeMap:
    return NodeMap.build(Member(f.rank, f.host, f.node_rank, f.boot_id) for f in facts)


def test_healthy_job_passes_every_rule():
    facts = healthy()
    results = check_consistency(facts, node_map(facts))
    assert [r.id for r in results] == [
        "cluster.hostnames",
        "cluster.versions",
        "cluster.env",
        "cluster.ifname",
        "cluster.master_addr",
        "cluster.gpus",
    ]
    assert {r.status for r in results} == {Status.PASS}, [r.summary for r in results]
    assert all(r.group == "cluster" for r in results)
    by_id = {r.id: r for r in results}
    assert "torch 2.14.1+cu130" in by_id["cluster.versions"].summary
    assert "NCCL_DEBUG" not in by_id["cluster.env"].summary
    assert "slowest connect 0.7 ms" in by_id["cluster.master_addr"].summary
    assert by_id["cluster.gpus"].summary == "4 ranks on 4 distinct GPUs"


def test_planted_nccl_variable_names_the_node_and_both_values():
    facts = healthy()
    facts[2] = replace(facts[2], env={**facts[2].env, "NCCL_IB_DISABLE": "1"})
    facts[3] = replace(facts[3], env={**facts[3].env, "NCCL_IB_DISABLE": "1"})
    result = check_env(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert result.summary == (
        "NCCL_IB_DISABLE: 1 on node 1 (gpu08, ranks 2-3); unset on node 0 (gpu07, ranks 0-1)"
    )
    assert "InfiniBand" in (result.fix or "")


def test_two_nodes_one_rank_each_odd_value_first():
    first = rank_facts(0, "vm", 0)
    facts = [first, rank_facts(1, "vm", 1, env={**first.env, "NCCL_IB_DISABLE": "1"})]
    result = check_env(facts, node_map(facts))
    assert result.summary == (
        "NCCL_IB_DISABLE: 1 on node 1 (vm, rank 1); unset on node 0 (vm, rank 0)"
    )


def test_unknown_variable_differing_is_a_warning_and_harmless_ones_are_details():
    facts = healthy()
    facts[1] = replace(facts[1], env={**facts[1].env, "NCCL_MIN_NCHANNELS": "4"})
    facts[3] = replace(facts[3], env={**facts[3].env, "NCCL_DEBUG": "INFO"})
    result = check_env(facts, node_map(facts))
    assert result.status == Status.WARN
    assert result.summary.startswith("NCCL_MIN_NCHANNELS: 4 on node 0 (gpu07, rank 1)")
    assert any("NCCL_DEBUG" in d and "may differ" in d for d in result.details)


def test_world_size_disagreement_fails():
    facts = healthy()
    facts[3] = replace(facts[3], env={**facts[3].env, "WORLD_SIZE": "8"})
    result = check_env(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert "WORLD_SIZE: 8 on node 1 (gpu08, rank 3)" in result.summary


@pytest.mark.parametrize(
    ("key", "status"),
    [
        ("nccl", Status.FAIL),
        ("torch", Status.FAIL),
        ("driver", Status.WARN),
        ("python", Status.WARN),
    ],
)
def test_version_mismatch(key, status):
    facts = healthy()
    for i in (2, 3):
        facts[i] = replace(facts[i], versions={**VERSIONS, key: "other"})
    result = check_versions(facts, node_map(facts))
    assert result.status == status
    assert f"other on node 1 (gpu08, ranks 2-3); {VERSIONS[key]} on node 0" in result.summary


def test_cloned_hosts_sharing_a_name_fail():
    facts = [rank_facts(0, "localhost", 0), rank_facts(1, "localhost", 1, boot_id="other-boot")]
    result = check_hostnames(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert "different machines share the host name localhost" in result.summary


def test_two_launchers_on_one_machine_warn():
    facts = [rank_facts(0, "vm", 0, boot_id="b"), rank_facts(1, "vm", 1, boot_id="b")]
    result = check_hostnames(facts, node_map(facts))
    assert result.status == Status.WARN
    assert result.summary == "node 0 (vm, rank 0) and node 1 (vm, rank 1) run on one machine (vm)"


def test_duplicate_node_rank_fails():
    facts = [rank_facts(0, "gpu07", 0), rank_facts(1, "gpu08", 0)]
    nodes = node_map(facts)
    assert [n.index for n in nodes.nodes] == [0, 1]  # the second claimant gets a free index
    result = check_hostnames(facts, nodes)
    assert result.status == Status.FAIL
    assert "node rank 0 is claimed by gpu07 and gpu08" in result.summary


def test_interface_missing_on_one_node():
    facts = healthy()
    for i in (2, 3):
        facts[i] = replace(facts[i], interfaces=("eth0", "lo"))
    result = check_ifname(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert result.summary == (
        "NCCL_SOCKET_IFNAME=ib matches no usable interface on node 1 (gpu08, ranks 2-3) "
        "(it has eth0, lo)"
    )


def test_gloo_ifname_takes_exact_names():
    facts = [
        rank_facts(0, "a", 0, env={"GLOO_SOCKET_IFNAME": "eth0"}),
        rank_facts(1, "b", 1, env={"GLOO_SOCKET_IFNAME": "eth"}),
    ]
    result = check_ifname(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert "GLOO_SOCKET_IFNAME=eth matches no usable interface on node 1 (b, rank 1)" in (
        result.summary
    )


@pytest.mark.parametrize(
    ("spec", "accepted"),
    [
        ("ib", ["ib0", "ib1"]),
        ("eth,ib0", ["eth0", "ib0"]),
        ("=ib", []),
        ("=ib0", ["ib0"]),
        ("^lo,docker", ["eth0", "ib0", "ib1"]),
        ("^=ib0", ["lo", "eth0", "ib1", "docker0"]),
    ],
)
def test_nccl_ifname_rules(spec, accepted):
    names = ["lo", "eth0", "ib0", "ib1", "docker0"]
    assert nccl_ifname_matches(spec, names) == accepted


def test_master_addr_unresolvable_on_one_node():
    facts = healthy()
    facts[3] = replace(facts[3], master_resolved=(), master_error="does not resolve: Name unknown")
    result = check_master_addr(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert result.summary == (
        "MASTER_ADDR=gpu07 does not resolve: Name unknown on node 1 (gpu08, rank 3)"
    )


def test_master_addr_resolving_differently_warns():
    facts = healthy()
    for i in (0, 1):
        facts[i] = replace(facts[i], master_resolved=("127.0.1.1",))
    result = check_master_addr(facts, node_map(facts))
    assert result.status == Status.WARN
    assert "127.0.1.1 on node 0 (gpu07, ranks 0-1)" in result.summary


def test_two_ranks_on_one_gpu_fail():
    facts = healthy()
    facts[1] = replace(facts[1], gpu_uuid=facts[0].gpu_uuid)
    result = check_gpus(facts, node_map(facts))
    assert result.status == Status.FAIL
    assert result.summary == "GPU-gpu07-0 is used by node 0 (gpu07, ranks 0-1)"
    assert "set_device" in (result.fix or "")


def test_gpu_rules_without_gpus_and_with_some():
    cpu = [replace(f, gpu_uuid=None) for f in healthy()]
    assert check_gpus(cpu, node_map(cpu)).status == Status.SKIP
    mixed = healthy()
    mixed[3] = replace(mixed[3], gpu_uuid=None)
    assert check_gpus(mixed, node_map(mixed)).status == Status.WARN


def test_same_uuid_on_different_machines_is_not_a_duplicate():
    facts = healthy()
    facts[2] = replace(facts[2], gpu_uuid=facts[0].gpu_uuid)  # other boot id: another machine
    assert check_gpus(facts, node_map(facts)).status == Status.PASS


def test_describe_and_compress():
    facts = healthy()
    nodes = node_map(facts)
    assert fold_ranks([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"
    assert nodes.describe([1, 2]) == "node 0 (gpu07, rank 1) and node 1 (gpu08, rank 2)"
    many = NodeMap.build(Member(r, f"h{r}", r) for r in range(8))
    assert many.describe(range(8)) == "nodes 0-7 (8 nodes)"
    assert describe_values({0: "1", 1: None, 2: None}, nodes) == (
        "1 on node 0 (gpu07, rank 0); unset on node 0 (gpu07, rank 1) and node 1 (gpu08, rank 2)"
    )


def test_mpi_ranks_without_node_rank_group_by_host():
    nodes = NodeMap.build([Member(0, "a"), Member(1, "a"), Member(2, "b"), Member(3, "b")])
    assert [(n.index, n.host, n.ranks) for n in nodes.nodes] == [(0, "a", (0, 1)), (1, "b", (2, 3))]


def test_compared_env_and_facts_round_trip():
    env = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root", "WORLD_SIZE": "2"}
    assert compared_env(env) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_DEBUG": "INFO",
        "WORLD_SIZE": "2",
    }
    facts = healthy()[2]
    assert RankFacts.from_json(facts.to_json()) == facts


def _report(rank: int, statuses: dict[str, tuple[Status, str]]) -> dict:
    results = [
        CheckResult(
            id=check_id,
            group=check_id.split(".")[0],
            title=check_id,
            status=status,
            summary=summary,
            fix="do this" if status in (Status.WARN, Status.FAIL) else None,
        ).to_json()
        for check_id, (status, summary) in statuses.items()
    ]
    return {"results": results}


def test_merge_reports_worst_status_and_where():
    facts = healthy()
    nodes = node_map(facts)
    ok = {"system.shm": (Status.PASS, "8 GiB free"), "gpu.count": (Status.PASS, "2 GPUs")}
    bad = {"system.shm": (Status.FAIL, "64 MiB free"), "gpu.count": (Status.PASS, "2 GPUs")}
    merged, matrix = merge_reports(
        {0: _report(0, ok), 1: _report(1, ok), 2: _report(2, bad), 3: _report(3, bad)}, nodes
    )
    shm = merged[0]
    assert shm.status == Status.FAIL
    assert shm.summary == "64 MiB free (on node 1 (gpu08, ranks 2-3))"
    assert shm.details[:2] == (
        "fail on node 1 (gpu08, ranks 2-3): 64 MiB free",
        "pass on node 0 (gpu07, ranks 0-1): 8 GiB free",
    )
    assert shm.fix == "do this"
    assert merged[1].summary == "2 GPUs"  # identical everywhere: unchanged
    row = matrix[0].to_json()
    assert row == {
        "id": "system.shm",
        "group": "system",
        "worst": "fail",
        "by_node": {"0": "pass", "1": "fail"},
        "differs": [1],  # on a tie the lowest node's status is the common one
    }
    assert matrix[1].differs == ()


def test_round_robin_meets_every_pair_once():
    for count in range(2, 10):
        participants = list(range(0, count * 4, 4))  # node leaders: ranks 0, 4, 8, ...
        rounds = round_robin(participants)
        pairs = [p for r in rounds for p in r]
        assert len(pairs) == len(set(pairs)) == count * (count - 1) // 2
        for pairs_in_round in rounds:
            ranks = [rank for pair in pairs_in_round for rank in pair]
            assert len(ranks) == len(set(ranks))  # no rank twice in a round
    assert round_robin([0]) == []


def test_link_fault_switch_parsing():
    assert LinkFault.from_env({}) is None
    fault = LinkFault.from_env({"DDPDOCTOR_TEST_LINK_FAULT": "slow:rank=2,seconds=0.5"})
    assert fault == LinkFault("slow", 2, 0.5)


def test_busbw_follows_nccl_tests():
    algbw, busbw = bus_bandwidth(8 << 30, 1.0, 8)
    assert algbw == pytest.approx(8.589934592)
    assert busbw == pytest.approx(algbw * 2 * 7 / 8)


def bench(
    rank: int, pairs=(), correct=True, bad=(), seconds=0.004, error=None, participants=(0, 1, 2, 3)
) -> RankBench:
    return RankBench(
        rank=rank,
        backend="gloo",
        device="cpu",
        allreduce=AllReduceResult(correct, 4 << 20, seconds, tuple(bad), None, error),
        pairs=tuple(pairs),
        participants=tuple(participants),
    )


def four_nodes() -> NodeMap:
    return NodeMap.build(Member(r, f"n{r}", r) for r in range(4))


def pair(a, b, seconds=0.01, error=None) -> PairResult:
    return PairResult(a, b, 4 << 20, None if error else seconds, error)


def test_allreduce_bandwidth_and_corruption():
    nodes = four_nodes()
    ok = judge_allreduce([bench(r, seconds=0.004 + r / 1000) for r in range(4)], 4, nodes)
    assert ok.status == Status.PASS
    assert ok.facts["seconds"] == pytest.approx(0.007)  # the slowest rank sets the pace
    assert ok.facts["busbw_gbps"] == pytest.approx(ok.facts["algbw_gbps"] * 1.5)
    wrong = [bench(r, correct=False, bad=[2]) for r in range(4)]
    bad = judge_allreduce(wrong, 4, nodes)
    assert bad.status == Status.FAIL
    assert "the data of node 2 (n2, rank 2) came back wrong" in bad.summary
    failed = judge_allreduce([bench(0), bench(1, error="RuntimeError: closed")], 4, nodes)
    assert failed.status == Status.FAIL and "node 1 (n1, rank 1)" in failed.summary


def test_one_slow_link_is_named():
    pairs = [pair(0, 1), pair(0, 2), pair(0, 3), pair(1, 2, seconds=0.08), pair(1, 3), pair(2, 3)]
    result = judge_links(merge_pairs([bench(0, pairs)]), four_nodes())
    assert result.status == Status.WARN
    assert result.summary.startswith("node 1 (n1) <-> node 2 (n2) runs at 0.10 GB/s")
    assert result.facts["median_gbps"] == pytest.approx(0.838860800)


def test_one_slow_node_is_named():
    pairs = [pair(0, 1), pair(0, 2), pair(0, 3, 0.1), pair(1, 2), pair(1, 3, 0.1), pair(2, 3, 0.1)]
    result = judge_links(merge_pairs([bench(0, pairs)]), four_nodes())
    assert result.status == Status.WARN
    assert result.summary.startswith("node 3 (n3) is slow on all its links")


def test_a_link_that_times_out_fails_and_either_side_counts():
    seen_by_0 = [pair(0, 1), pair(0, 2), pair(0, 3)]
    seen_by_1 = [pair(0, 1), pair(1, 2), pair(1, 3)]
    seen_by_2 = [pair(0, 2), pair(1, 2), pair(2, 3, error="TimeoutError: timed out after 5 s")]
    seen_by_3 = [pair(0, 3), pair(1, 3), pair(2, 3)]  # rank 3 finished its side in time
    benches = [bench(0, seen_by_0), bench(1, seen_by_1), bench(2, seen_by_2), bench(3, seen_by_3)]
    result = judge_links(merge_pairs(benches), four_nodes())
    assert result.status == Status.FAIL
    assert result.summary == "node 2 (n2) <-> node 3 (n3): TimeoutError: timed out after 5 s"


def test_pairs_nobody_reported_fail_and_a_common_node_is_named():
    benches = [
        bench(0, [pair(0, 1), pair(0, 2), pair(0, 3)]),
        bench(1, [pair(0, 1), pair(1, 2)]),
        bench(2, [pair(0, 2), pair(1, 2)]),
    ]
    result = judge_links(merge_pairs(benches), four_nodes())
    assert result.status == Status.FAIL
    assert result.summary.startswith("node 3 (n3) on all its failing links; ")
    assert any("(ranks 1, 3): no result from either rank" in d for d in result.details)


def test_links_with_one_node_or_two():
    assert judge_links([], four_nodes()).status == Status.SKIP
    two = judge_links([pair(0, 1)], four_nodes())
    assert two.status == Status.PASS and two.summary.endswith("0.84 GB/s")


def payload(facts: RankFacts, statuses: dict[str, tuple[Status, str]]) -> dict:
    return {"rank": facts.rank, "facts": facts.to_json(), "report": _report(facts.rank, statuses)}


def test_rank_0_assembles_one_report_with_a_cluster_section():
    from ddpdoctor.distributed_doctor.verdict import joined_ok
    from ddpdoctor.launchers.identity import detect_launch

    facts = healthy()
    facts[3] = replace(facts[3], env={**facts[3].env, "NCCL_IB_DISABLE": "1"})
    local = {"system.shm": (Status.PASS, "8 GiB free")}
    payloads = [payload(f, local) for f in facts]
    pairs = [pair(0, 2)]
    leaders = (0, 2)  # one rank per node takes part in the link matrix
    benches = [
        bench(r, pairs if r == 0 else (), seconds=0.01, participants=leaders).to_json()
        for r in range(4)
    ]
    env = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}
    outcome = joined_ok(
        detect_launch(env),
        payloads,
        benches,
        join_s=0.5,
        group_error=None,
        group_s=0.1,
        strict=False,
        elapsed_s=2.0,
    )
    ids = [r.id for r in outcome.report.results]
    assert ids[0] == "system.shm"
    assert ids[1:3] == ["cluster.join", "cluster.group"]
    assert ids[-2:] == ["cluster.allreduce", "cluster.links"]
    assert outcome.report.exit_code == 1
    env_result = outcome.report.by_id("cluster.env")
    assert env_result.summary.startswith("NCCL_IB_DISABLE: 1 on node 1 (gpu08, rank 3); unset")
    section = outcome.cluster
    assert section["nodes"] == [
        {"node": 0, "host": "gpu07", "node_rank": 0, "ranks": [0, 1]},
        {"node": 1, "host": "gpu08", "node_rank": 1, "ranks": [2, 3]},
    ]
    assert [r["node"] for r in section["ranks"]] == [0, 0, 1, 1]
    assert [(link["host_a"], link["host_b"]) for link in section["links"]] == [("gpu07", "gpu08")]
    assert section["allreduce"]["busbw_gbps"] == pytest.approx(4 * 1048576 / 0.01 / 1e9 * 1.5)


def test_text_report_matrix_and_sections():
    import io

    from rich.console import Console

    from ddpdoctor.checks.report import DoctorReport
    from ddpdoctor.distributed_doctor.render import matrix_lines, render_distributed

    facts = healthy()
    nodes = node_map(facts)
    ok = {"system.shm": (Status.PASS, "8 GiB free"), "nccl.env": (Status.PASS, "none set")}
    bad = {"system.shm": (Status.FAIL, "64 MiB free"), "nccl.env": (Status.PASS, "none set")}
    merged, matrix = merge_reports(
        {0: _report(0, ok), 1: _report(1, ok), 2: _report(2, bad), 3: _report(3, bad)}, nodes
    )
    cluster = check_consistency(facts, nodes)
    report = DoctorReport.build([*merged, *cluster], elapsed_s=1.0)
    stream = io.StringIO()
    render_distributed(
        report,
        nodes=nodes,
        matrix=matrix,
        launcher="torchrun",
        world_size=4,
        console=Console(file=stream, width=120, color_system=None),
    )
    text = stream.getvalue()
    assert text.startswith("ddpdoctor doctor --distributed  torchrun, 4 ranks on 2 nodes")
    lines = text.splitlines()
    shm = next(line for line in lines if "system.shm" in line)
    assert shm.split() == ["✗", "system.shm", "✓", "✗", "fail", "on", "node", "1"]
    header = lines[lines.index("Checks on each node") + 1]
    assert header.index("0") == shm.index("✓") and header.rstrip().endswith("1")
    assert "On the nodes: System" in text and "64 MiB free (on node 1 (gpu08, ranks 2-3))" in text
    assert "Across the cluster" in text and "Summary:" in lines[-1]
    assert "none set" not in text  # passing local results stay in the matrix without -v

    wide = NodeMap.build(Member(r, f"h{r}", r) for r in range(10))
    rows = merge_reports({r: _report(r, ok if r != 7 else bad) for r in range(10)}, wide)[1]
    text_rows = [line.plain for line in matrix_lines(rows, wide)]
    assert text_rows[1].split() == ["✗", "system.shm", "fail", "on", "node", "7"]
    assert text_rows[2].split() == ["✓", "nccl.env", "pass", "on", "all", "10", "nodes"]


def test_a_master_name_that_resolved_late_is_reported_with_how_long_it_took():
    facts = healthy()
    facts[3] = replace(facts[3], master_name_wait_s=12.5)
    result = check_master_addr(facts, node_map(facts))
    assert result.status == Status.PASS
    assert "the name did not resolve for 12.5 s on node 1 (gpu08, rank 3) before it did" in (
        result.summary
    )
    assert result.facts["name_wait_s"] == {"3": 12.5}
