from __future__ import annotations

from ddpdoctor.monitor.judge.rules import transport
from ddpdoctor.monitor.model.snapshot import LogLine, Verdict
from tests.unit.monitor.test_monitor_builders import snap, view, waiting


def test_all_ranks_stuck_in_one_collective_points_at_the_transport():
    nccl = LogLine(
        "nccl vm.1",
        "vm:1:2 [0] NCCL WARN Call to connect returned Connection refused",
        0,
        "warn",
        "nccl/vm.1.log",
        7,
    )
    out = transport.detect(snap([waiting(0, 41, 9.0), waiting(1, 41, 8.0)], logs=(nccl,)))
    assert out is not None and out.verdict is Verdict.HANG and not out.culprits
    finding = out.findings[0]
    assert finding.id == "transport_stall"
    assert "all ranks are stuck in all_reduce #41" in finding.summary
    assert "NCCL_SOCKET_IFNAME" in finding.fix and "NCCL_DEBUG=INFO" in finding.fix
    assert any(e.file == "nccl/vm.1.log" and e.line == 7 for e in finding.evidence)


def test_a_rank_behind_is_a_program_hang_not_transport():
    assert transport.detect(snap([waiting(0, 41, 9.0), view(1, seq=40)])) is None


def test_different_ops_at_the_same_seq_are_a_mismatch_not_transport():
    ranks = [waiting(0, 41, 9.0), waiting(1, 41, 9.0, op="barrier")]
    assert transport.detect(snap(ranks)) is None


def test_short_waits_are_not_stalls():
    assert transport.detect(snap([waiting(0, 41, 2.0), waiting(1, 41, 2.0)])) is None
