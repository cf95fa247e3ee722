"""What the findings say: the facts each explainer pulls out of its lines, and its fix."""

from __future__ import annotations

import pytest

from ddpdoctor.explain import explain_files, explain_lines
from ddpdoctor.findings import Severity
from tests.conftest import FIXTURES

LOCAL = FIXTURES / "local"


def by_id(paths) -> dict:
    return {f.id: f for f in explain_files(paths)}


def test_watchdog_names_the_collective_and_the_ranks_that_wrote_nothing():
    found = by_id([FIXTURES / "20-torch-watchdog-timeout-allreduce-new-format.log"])
    timeout = found["watchdog.timeout"]
    assert "ALLREDUCE #1580" in timeout.summary
    assert "466119168 elements" in timeout.summary and "last completed #1579" in timeout.summary
    assert "ranks 0, 3, 4" in timeout.summary and "600 s" in timeout.summary
    behind = found["watchdog.rank_behind"]
    assert behind.ranks == (1, 2) and "wrote no watchdog line" in behind.summary


def test_flight_recorder_hint_says_which_variable_to_set():
    found = by_id([FIXTURES / "25-torch-watchdog-flight-recorder-disabled.log"])
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in found["watchdog.flight_recorder_disabled"].fix
    assert "work #120049" in found["watchdog.timeout"].summary
    assert "last completed #120048" in found["watchdog.timeout"].summary


def test_teardown_is_a_consequence_not_an_error():
    found = by_id([FIXTURES / "23-torch-watchdog-terminate-process-down.log"])
    assert found["watchdog.teardown"].severity is Severity.INFO
    assert "consequence" in found["watchdog.teardown"].summary
    assert "1 element" in found["watchdog.timeout"].summary


def test_sigkill_points_at_the_oom_killer():
    killed = by_id([FIXTURES / "30-torchrun-childfailederror-sigkill.log"])["torchrun.killed"]
    assert "SIGKILL" in killed.summary and "OOM" in killed.summary
    assert "dmesg" in killed.fix and killed.ranks == (0,)


def test_torchrun_table_separates_root_cause_from_the_peers_it_stopped():
    failed = by_id([LOCAL / "torchrun-crash-table.log"])["torchrun.failed"]
    assert failed.ranks == (1,)
    assert "exited with code 1" in failed.summary and "stopped rank 0" in failed.summary


def test_a_torchrun_table_without_its_root_cause_header_still_names_the_culprit():
    failed = by_id([LOCAL / "torchrun-table-no-root-header.log"])["torchrun.failed"]
    assert failed.ranks == (1,)
    assert "exited with code 1" in failed.summary and "stopped rank 0" in failed.summary


# The report: an excerpt from the table's title on, the `@record` traceback in the entry.
BUG_PY_EXCERPT = """\
bug.py FAILED
------------------------------------------------------------
  time      : 2025-03-04_10:21:07
  host      : gpu-node-3
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 52817)
  error_file: /tmp/torchelastic_k2j4/none_x1/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
      return f(*args, **kwargs)
    File "/home/user/bug.py", line 21, in main
      dist.barrier()
    File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
      return func(*args, **kwargs)
  RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
============================================================
"""


def test_a_pasted_failure_entry_without_any_section_header(tmp_path):
    pasted = tmp_path / "pasted.log"
    pasted.write_text(BUG_PY_EXCERPT)
    failed = by_id([pasted])["torchrun.failed"]
    assert failed.ranks == (1,)
    assert failed.summary.startswith("Rank 1 (pid 52817, on gpu-node-3) exited with code 1")


def test_a_pasted_entry_that_starts_at_its_index_line(tmp_path):
    pasted = tmp_path / "pasted.log"
    pasted.write_text("[0]:\n" + BUG_PY_EXCERPT.split("\n", 2)[2])
    failed = by_id([pasted])["torchrun.failed"]
    assert failed.ranks == (1,) and "exited with code 1" in failed.summary


def test_a_bad_address_family_names_the_socket_ifname_the_log_set():
    found = by_id([FIXTURES / "47-nccl-socket-ifname-eth2-bad-address-family.log"])
    bad = found["nccl.bad_socket_address"]
    assert "NCCL_SOCKET_IFNAME=eth2 (set earlier in this log)" in bad.summary
    assert "family 59936" in bad.summary
    assert "NCCL_SOCKET_IFNAME (now eth2)" in bad.fix


def test_no_socket_interface_names_the_socket_ifname_the_log_set(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text(
        "node1:4242:4242 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth2\n"
        "node1:4242:4242 [0] NCCL INFO Bootstrap : no socket interface found\n"
    )
    missing = by_id([log])["nccl.no_socket_interface"]
    assert "NCCL_SOCKET_IFNAME=eth2" in missing.summary and "(now eth2)" in missing.fix
    assert [e.line for e in missing.evidence] == [1, 2]


def test_a_socket_ifname_from_another_log_is_not_named(tmp_path):
    other = tmp_path / "a-other.log"
    other.write_text("node2:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth2\n")
    failing = tmp_path / "b-failing.log"
    failing.write_text("node1:2:2 [0] NCCL INFO Bootstrap : no socket interface found\n")
    missing = by_id([other, failing])["nccl.no_socket_interface"]
    assert "eth2" not in missing.summary and "eth2" not in missing.fix


def test_abort_in_a_run_directory_is_explained_with_the_gloo_size_mismatch():
    found = by_id([LOCAL / "run-gloo-size-mismatch"])
    assert "SIGABRT" in found["torchrun.signal"].summary
    assert "20 vs 12 bytes" in found["gloo.size_mismatch"].summary
    # rank 0's stderr.log has no [rank0]: prefix: the rank comes from attempt_0/0/stderr.log
    assert found["gloo.size_mismatch"].ranks == (0,)
    assert found["gloo.peer_closed"].severity is Severity.WARNING  # a consequence of rank 0


def test_a_peer_closed_error_alone_stays_an_error():
    found = by_id([LOCAL / "gloo-peer-closed-rank0.log"])
    assert found["gloo.peer_closed"].severity is Severity.ERROR
    assert "127.0.0.1" in found["gloo.peer_closed"].summary
    assert "python.exception" not in found  # the specific explanation replaces the generic one


def test_model_mismatch_across_both_ranks_logs():
    found = by_id([LOCAL / "ddp-model-mismatch-rank0.log", LOCAL / "ddp-model-mismatch-rank1.log"])
    assert found["ddp.model_mismatch"].ranks == (1,)
    assert "[5, 4]" in found["ddp.model_mismatch"].summary
    assert found["gloo.peer_closed"].severity is Severity.WARNING


def test_detail_fingerprints_name_both_ranks_and_ops():
    old = by_id([FIXTURES / "43-ddp-collective-fingerprint-mismatch-detail.log"])
    summary = old["ddp.collective_mismatch"].summary
    assert "rank 1: ALLREDUCE #485 of [25] Float" in summary
    assert "rank 0: BROADCAST #485 of [1] Long" in summary


def test_detail_fingerprints_prefer_each_ranks_own_report():
    found = by_id(
        [LOCAL / "ddp-detail-mismatch-rank0.log", LOCAL / "ddp-detail-mismatch-rank1.log"]
    )
    summary = found["ddp.collective_mismatch"].summary
    assert "rank 0: BARRIER #2" in summary and "rank 1: ALLREDUCE #2 of [5] Float" in summary
    assert "reported it" not in summary
    alone = by_id([LOCAL / "ddp-detail-mismatch-rank0.log"])["ddp.collective_mismatch"]
    assert "(as rank 0 reported it)" in alone.summary


def test_numeric_hostname_is_decoded():
    found = by_id([FIXTURES / "37-c10d-numeric-hostname-parsed-as-ip.log"])
    assert "0.104.99.143" in found["c10d.numeric_hostname"].summary
    assert "'6841231'" in found["c10d.numeric_hostname"].summary


def test_network_findings_name_addresses_and_interfaces():
    assert (
        "veth25f2e72"
        in by_id([FIXTURES / "06-net-socket-veth-connect-timed-out.log"])[
            "nccl.virtual_interface"
        ].summary
    )
    connect = by_id([FIXTURES / "05-bootstrap-connect-refused-retrying.log"])
    assert "10.38.10.112<21724>" in connect["nccl.connect_failed"].summary
    assert "stale file://" in connect["nccl.connect_failed"].fix
    gloo = by_id([FIXTURES / "41-gloo-socket-ifname-exclusion-syntax.log"])["gloo.ifname_invalid"]
    assert "GLOO_SOCKET_IFNAME=^lo" in gloo.summary
    port = by_id([LOCAL / "c10d-eaddrinuse-torchrun.log"])["c10d.port_in_use"]
    assert "29077" in port.summary


def test_infiniband_error_12_suggests_the_gid_index():
    found = by_id([FIXTURES / "13-ib-completion-error-12-torch-side.log"])
    assert "error 12 is a timeout" in found["nccl.ib_completion_error"].summary
    assert "NCCL_IB_GID_INDEX" in found["nccl.ib_completion_error"].fix
    assert found["nccl.remote_error"].severity is Severity.WARNING  # the IB error explains it


def test_store_findings_count_the_missing_ranks():
    joined = by_id([LOCAL / "c10d-store-clients-joined-rank0.log"])["c10d.store_timeout"]
    assert "Only 2 of 3 ranks" in joined.summary and "1 never started" in joined.summary
    env = by_id([FIXTURES / "39-env-rendezvous-missing-master-addr.log"])["c10d.env_missing"]
    assert "MASTER_ADDR" in env.summary and "torchrun" in env.fix


def test_interleaved_tee_output_keeps_each_ranks_traceback_apart():
    found = by_id([LOCAL / "torchrun-tee-interleaved.log"])
    exception = found["python.exception"]
    assert exception.ranks == (1,)
    assert "RuntimeError: injected failure at step 3 on rank 1" in exception.summary
    assert "/tmp/h6/job.py:19" in exception.summary
    assert found["gloo.peer_closed"].ranks == (0,)


def test_unused_parameters_name_the_indices():
    found = by_id([LOCAL / "ddp-unused-parameters-rank0.log"])
    assert "indices 2 3 on rank 0" in found["ddp.unused_parameters"].summary
    assert "find_unused_parameters=True" in found["ddp.unused_parameters"].fix


def test_benign_and_performance_lines_are_not_errors():
    found = by_id([LOCAL / "ddp-find-unused-warning-rank1.log"])
    assert [f.severity for f in found.values()] == [Severity.INFO]


def test_spawn_without_main_guard_outranks_the_parents_exception():
    found = by_id([LOCAL / "mp-spawn-bootstrap.log"])
    assert found["python.mp_bootstrap"].severity is Severity.ERROR
    assert found["python.exception"].severity is Severity.WARNING  # ProcessExitedException


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: vm: task 1: Killed",
        "srun: error: vm: task 0: Exited with exit code 3",
        "srun: error: vm: task 0: Terminated",
        "slurmstepd-vm: error: *** STEP 10.0 ON vm CANCELLED AT 2026-11-26T15:30:08 ***",
        "slurmstepd: error: *** JOB 11 ON vm CANCELLED AT 2026-11-26T15:31:00 DUE TO TIME LIMIT ***",
    ],
)
def test_slurm_task_and_step_lines_are_no_argparse_error(line):
    """Recorded from srun 23 (a task killed with SIGKILL, one exiting 3, a step scancel'led)."""
    assert "python.argparse_error" not in {f.id for f in explain_lines([line])}
    assert "python.argparse_error" in {f.id for f in explain_lines(["train.py: error: bad"])}
