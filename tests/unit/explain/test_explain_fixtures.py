"""Every fixture log gives its expected findings: id, severity, ranks and evidence line numbers.

The shared fixtures (NN-*.log) are real excerpts from public issue threads; local/ holds output
captured on this machine from real 2-rank gloo runs with torch 2.14.1 (first line of each: how).
"""

from __future__ import annotations

import pytest

from ddpdoctor.explain import explain_files
from ddpdoctor.findings import Severity
from tests.conftest import FIXTURES

# file -> [(id, severity, ranks, evidence line numbers)], in the order explain returns them
EXPECTED: dict[str, list[tuple[str, str, tuple[int, ...], list[int]]]] = {
    "01-healthy-init-2gpu-p2p-nccl-2.15.log": [
        ("nccl.virtual_interface", "warning", (), [7]),
        ("nccl.init", "info", (0, 1), [5, 8, 33, 34]),
    ],
    "02-cuda-failure-stub-libcuda.log": [
        ("nccl.stub_libcuda", "error", (), [2]),
    ],
    "03-bootstrap-no-socket-interface-found.log": [
        ("nccl.no_socket_interface", "error", (), [11]),
        ("nccl.init", "info", (), [8]),
    ],
    "05-bootstrap-connect-refused-retrying.log": [
        ("nccl.connect_failed", "error", (), [6]),
        ("nccl.connect_retry", "warning", (), [2, 3, 4]),
    ],
    "06-net-socket-veth-connect-timed-out.log": [
        ("nccl.virtual_interface", "error", (), [2, 5, 10]),
        ("nccl.connect_retry", "warning", (), [12, 13]),
        ("nccl.init", "info", (), [6]),
    ],
    "08-transport-p2p-ipc-peer-access-not-supported.log": [
        ("nccl.p2p_ipc_refused", "error", (), [9]),
        ("nccl.init", "info", (), [2]),
    ],
    "09-shm-no-space-left-dev-shm.log": [
        ("nccl.shm_exhausted", "error", (), [2, 4]),
    ],
    "11-duplicate-gpu-detected-nccl-warn.log": [
        ("nccl.duplicate_gpu", "error", (0, 1, 2, 4), [3, 8, 13]),
    ],
    "13-ib-completion-error-12-torch-side.log": [
        ("nccl.ib_completion_error", "error", (), [2]),
        ("nccl.remote_error", "warning", (), [2]),
        ("nccl.init", "info", (), [2]),
        ("watchdog.teardown", "info", (), [2]),
    ],
    "15-ib-reg-mr-memlock.log": [
        ("nccl.ib_memlock", "error", (), [2]),
    ],
    "16-nccl-version-mismatch-across-nodes.log": [
        ("nccl.version_mismatch", "error", (), [2]),
    ],
    "17-mismatched-collective-old-nccl.log": [
        ("nccl.mismatched_collective", "error", (39,), [2]),
    ],
    "20-torch-watchdog-timeout-allreduce-new-format.log": [
        ("watchdog.timeout", "error", (0, 3, 4), [2, 3, 4, 5]),
        ("watchdog.rank_behind", "warning", (1, 2), [2, 3, 5]),
    ],
    "23-torch-watchdog-terminate-process-down.log": [
        ("watchdog.timeout", "error", (2, 7), [5, 7, 8]),
        ("watchdog.rank_behind", "warning", (0, 1, 3, 4, 5, 6), [5, 8]),
        ("watchdog.teardown", "info", (), [2, 3, 4, 5, 7, 8]),
    ],
    "25-torch-watchdog-flight-recorder-disabled.log": [
        ("watchdog.timeout", "error", (5,), [3]),
        ("watchdog.rank_behind", "warning", (0, 2, 4, 6), [3]),
        ("watchdog.flight_recorder_disabled", "info", (1, 5), [2, 6]),
        ("watchdog.teardown", "info", (3,), [4, 7]),
    ],
    "26-torch-heartbeat-monitor-watchdog-stuck.log": [
        ("watchdog.heartbeat_stuck", "error", (0, 1, 2), [2, 4, 5, 6]),
    ],
    "30-torchrun-childfailederror-sigkill.log": [
        ("torchrun.killed", "error", (0,), [14, 16]),
    ],
    "32-torchrun-argparse-local-rank-exitcode-2.log": [
        ("torchrun.local_rank_arg", "error", (0,), [2, 3]),
    ],
    "33-c10d-eaddrinuse.log": [
        ("c10d.port_in_use", "error", (), [2, 3, 4]),
    ],
    "35-c10d-client-socket-timeout-master-unreachable.log": [
        ("c10d.connect_timeout", "error", (), [2]),
    ],
    "37-c10d-numeric-hostname-parsed-as-ip.log": [
        ("c10d.numeric_hostname", "error", (), [2, 3, 4, 5]),
    ],
    "39-env-rendezvous-missing-master-addr.log": [
        ("c10d.env_missing", "error", (), [3]),
    ],
    "40-gloo-loopback-connectfullmesh-refused.log": [
        ("gloo.loopback", "error", (8,), [2, 3, 4]),
    ],
    "41-gloo-socket-ifname-exclusion-syntax.log": [
        ("gloo.ifname_invalid", "error", (), [3]),
    ],
    "43-ddp-collective-fingerprint-mismatch-detail.log": [
        ("ddp.collective_mismatch", "error", (0, 1), [2]),
        ("torchrun.failed", "error", (0,), [3]),
    ],
    "44-ddp-unused-parameters-reduction.log": [
        ("ddp.unused_parameters", "error", (), [2]),
    ],
    "45-ddp-model-param-mismatch.log": [
        ("ddp.model_mismatch", "error", (0, 3), [6]),
    ],
    "46-torch-device-unknown-warning.log": [
        ("nccl.device_unknown", "warning", (6,), [2]),
    ],
    "47-nccl-socket-ifname-eth2-bad-address-family.log": [
        ("nccl.bad_socket_address", "error", (), [3, 7]),
    ],
    "local/c10d-client-connect-timeout.log": [
        ("c10d.connect_timeout", "error", (), [2, 3, 23, 24, 62]),
    ],
    "local/c10d-eaddrinuse-torchrun.log": [
        ("c10d.port_in_use", "error", (), [41]),
    ],
    "local/c10d-store-clients-joined-rank0.log": [
        ("c10d.store_timeout", "error", (), [20]),
    ],
    "local/c10d-store-wait-timeout-rank1.log": [
        ("c10d.store_wait_timeout", "error", (), [22]),
    ],
    "local/ddp-detail-mismatch-rank0.log": [
        ("ddp.collective_mismatch", "error", (0, 1), [11]),
    ],
    "local/ddp-detail-mismatch-rank1.log": [
        ("ddp.collective_mismatch", "error", (0, 1), [11]),
    ],
    "local/ddp-find-unused-warning-rank1.log": [
        ("ddp.find_unused_unneeded", "info", (1,), [2]),
    ],
    "local/ddp-marked-ready-twice-rank0.log": [
        ("ddp.marked_ready_twice", "error", (0,), [22, 23]),
    ],
    "local/ddp-model-mismatch-rank0.log": [
        ("gloo.peer_closed", "error", (0,), [12]),
    ],
    "local/ddp-model-mismatch-rank1.log": [
        ("ddp.model_mismatch", "error", (1,), [11]),
    ],
    "local/ddp-unused-parameters-rank0.log": [
        ("ddp.unused_parameters", "error", (0,), [18, 21]),
    ],
    "local/env-missing-rank.log": [
        ("c10d.env_missing", "error", (), [19]),
    ],
    "local/gloo-monitored-barrier-rank0.log": [
        ("gloo.monitored_barrier", "error", (1,), [2, 9]),
        ("gloo.timeout", "error", (0,), [11]),
    ],
    "local/gloo-peer-closed-rank0.log": [
        ("gloo.peer_closed", "error", (0,), [12]),
    ],
    "local/gloo-peer-reset-rank0.log": [
        ("gloo.peer_closed", "error", (0,), [12]),
    ],
    "local/gloo-timeout-barrier-rank0.log": [
        ("gloo.timeout", "error", (0,), [10]),
    ],
    "local/gloo-timeout-barrier-torchrun.log": [
        ("torchrun.failed", "error", (0,), [3, 29, 38]),
        ("torchrun.sigterm_peers", "info", (), [2]),
    ],
    "local/launch-local-rank-argparse.log": [
        ("torchrun.local_rank_arg", "error", (0, 1), [12, 14, 15, 44]),
    ],
    "local/mp-spawn-bootstrap.log": [
        ("python.mp_bootstrap", "error", (), [42, 99]),
        ("python.exception", "warning", (), [118, 125]),
    ],
    "local/torchrun-crash-table.log": [
        ("torchrun.failed", "error", (1,), [3, 29, 38]),
        ("torchrun.sigterm_peers", "info", (), [2]),
    ],
    "local/torchrun-sigkill-table.log": [
        ("torchrun.killed", "error", (1,), [3, 29, 38, 40]),
        ("torchrun.sigterm_peers", "info", (), [2]),
    ],
    "local/torchrun-table-no-root-header.log": [
        ("torchrun.failed", "error", (1,), [9, 16]),
    ],
    "local/torchrun-tee-interleaved.log": [
        ("python.exception", "error", (1,), [5, 7]),
        ("torchrun.signal", "error", (1,), [19, 45, 54, 56]),
        ("gloo.peer_closed", "warning", (0,), [18]),
        ("torchrun.sigterm_peers", "info", (), [2]),
    ],
    "local/torchrun-stopped-sigterm.log": [
        ("torchrun.sigterm_peers", "info", (), [7, 8]),
        ("torchrun.stopped", "info", (), [10, 37]),
    ],
    # torchrun's view of a job ddpdoctor stopped after a hang (the command puts the run's own
    # diagnosis in its place: tests/integration/test_explain_cli.py)
    "local/run-stopped-hang": [
        ("torchrun.signal", "error", (0,), [6, 33, 42, 44]),
    ],
    # the same for a job over two launchers (nodes): each node's torchrun reports its SIGTERM
    "local/run-stopped-multinode": [
        ("torchrun.signal", "error", (0,), [2, 32, 34]),
        ("torchrun.signal", "error", (1,), [3, 33, 35]),
        ("gloo.peer_closed", "warning", (0,), [24]),
    ],
    # GPU code as published, under a user's own torchrun on a machine without a GPU
    "local/torchrun-no-gpu-before-init.log": [
        ("python.exception", "error", (), [9, 15, 19, 25]),
        ("torchrun.failed", "error", (0,), [26, 52, 61]),
    ],
    "local/run-gloo-size-mismatch": [
        ("gloo.size_mismatch", "error", (0,), [2, 3]),
        ("torchrun.signal", "error", (0,), [3, 29, 38, 40]),
        ("gloo.peer_closed", "warning", (1,), [10]),
        ("torchrun.sigterm_peers", "info", (), [2]),
    ],
}


def _summary(path) -> list[tuple[str, str, tuple[int, ...], list[int]]]:
    return [
        (f.id, f.severity.value, f.ranks, [e.line for e in f.evidence])
        for f in explain_files([path])
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_gives_its_findings(name):
    assert _summary(FIXTURES / name) == EXPECTED[name]


def test_every_fixture_is_covered():
    shipped = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("*.log")}
    shipped |= {p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "local").glob("*.log")}
    shipped |= {
        "local/run-gloo-size-mismatch",
        "local/run-stopped-hang",
        "local/run-stopped-multinode",
    }
    assert shipped == set(EXPECTED)


def test_the_healthy_log_has_no_error():
    findings = explain_files([FIXTURES / "01-healthy-init-2gpu-p2p-nccl-2.15.log"])
    assert findings and all(f.severity is not Severity.ERROR for f in findings)


def test_local_fixtures_say_where_they_came_from():
    for path in (FIXTURES / "local").rglob("*.log"):
        if path.stat().st_size:
            first = path.read_text(encoding="utf-8").splitlines()[0]
            assert first.startswith("# source: captured on "), path
            assert "torch 2.14.1" in first, path


def test_evidence_quotes_the_file_and_its_lines():
    path = FIXTURES / "11-duplicate-gpu-detected-nccl-warn.log"
    lines = path.read_text(encoding="utf-8").splitlines()
    (finding,) = explain_files([path])
    for evidence in finding.evidence:
        assert evidence.file == str(path)
        assert evidence.text == lines[evidence.line - 1]
