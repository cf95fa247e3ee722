"""The engine: combining lines across ranks and files, what explains what, run directories, bad input."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.explain import explain_files, explain_lines
from ddpdoctor.findings import Severity
from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
from ddpdoctor.protocol.rundir import RunDir


def ids(findings) -> list[str]:
    return [f.id for f in findings]


def by_id(findings) -> dict:
    return {f.id: f for f in findings}


def watchdog(rank: int, seq: int, op: str = "ALLREDUCE", numel: int = 10) -> str:
    return (
        f"[rank{rank}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
        f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}"
        f", NumelOut={numel}, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
    )


def progress(rank: int, seq: int, enqueued: int, completed: int) -> str:
    return (
        f"[rank{rank}]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 0 Rank {rank}] "
        f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last "
        f"enqueued NCCL work: {enqueued}, last completed NCCL work: {completed}."
    )


def test_the_rank_with_the_lowest_last_completed_work_is_behind():
    found = by_id(
        explain_lines(
            [
                progress(0, 41, 41, 40),
                progress(1, 41, 41, 40),
                progress(2, 39, 39, 38),
                watchdog(2, 39),
            ]
        )
    )
    behind = found["watchdog.rank_behind"]
    assert behind.severity is Severity.ERROR and behind.ranks == (2,)
    assert "#38" in behind.summary and "#40" in behind.summary
    assert found["watchdog.timeout"].ranks == (0, 1, 2)


def test_different_ops_at_one_sequence_number_are_a_mismatch():
    found = by_id(
        explain_lines([watchdog(0, 57, "ALLREDUCE", 10), watchdog(1, 57, "BROADCAST", 1)])
    )
    mismatch = found["watchdog.mismatch"]
    assert mismatch.ranks == (0, 1)
    assert "rank 0: ALLREDUCE of 10 elements" in mismatch.summary
    assert "rank 1: BROADCAST of 1 elements" in mismatch.summary


def test_watchdog_lines_combine_across_files(tmp_path):
    for rank in (0, 1, 3):
        (tmp_path / f"r{rank}.log").write_text(watchdog(rank, 7) + "\n")
    found = by_id(explain_files(sorted(tmp_path.iterdir())))
    assert found["watchdog.timeout"].ranks == (0, 1, 3)
    assert found["watchdog.rank_behind"].ranks == (2,)


def test_a_single_ranks_log_does_not_guess_missing_ranks():
    assert ids(explain_lines([watchdog(5, 7)])) == ["watchdog.timeout"]


def test_nccl_init_that_never_completed_is_the_blocker():
    lines = [
        "nodeA:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "nodeB:200:200 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
        "nodeA:100:101 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
    ]
    found = by_id(explain_lines(lines))
    blocker = found["nccl.init_incomplete"]
    assert "nodeB:200 [0]" in blocker.summary and blocker.evidence[0].line == 2
    assert found["nccl.init"].ranks == (0,)


def test_different_nccl_versions_across_logs():
    found = by_id(
        explain_lines(
            [
                "a:1:1 [0] NCCL INFO NCCL version 2.20.5+cuda12.4",
                "b:2:2 [0] NCCL INFO NCCL version 2.19.3+cuda12.2",
            ]
        )
    )
    assert "2.20.5+cuda12.4" in found["nccl.versions_differ"].summary
    assert found["nccl.versions_differ"].severity is Severity.ERROR


def test_nccl_versions_compare_without_build_and_package_suffixes():
    found = by_id(
        explain_lines(
            [
                "a:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, "
                "remote process exited or there was a network error, NCCL version 2.28.9",
                "b:2:2 [0] NCCL INFO NCCL version 2.28.9-1",
            ]
        )
    )
    assert "nccl.versions_differ" not in found
    assert found["nccl.init"].summary.startswith("NCCL 2.28.9+cuda13.0")


def test_nccl_versions_differing_in_the_patch_level_still_differ():
    found = by_id(
        explain_lines(
            [
                "a:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
                "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1201, internal error, "
                "NCCL version 2.28.3",
            ]
        )
    )
    assert found["nccl.versions_differ"].summary.endswith("2.28.9+cuda13.0, 2.28.3")


def test_a_specific_nccl_line_is_not_also_a_generic_warn():
    found = explain_lines(
        ["host:1:2 [0] include/socket.h:390 NCCL WARN Connect to 10.0.0.9<2> failed : No route"]
    )
    assert ids(found) == ["nccl.connect_failed"]


def test_bare_nccl_error_is_dropped_when_ncccls_own_reason_is_there():
    bare = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:784, unhandled cuda error, NCCL 2.7.8"
    assert ids(explain_lines([bare])) == ["nccl.torch_error"]
    reason = "h:1:2 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 x"
    assert "nccl.torch_error" not in ids(explain_lines([bare, reason]))


def test_benign_lines_give_no_findings():
    lines = [
        "[W socket.cpp:464] [c10d] The server socket cannot be initialized on [::]:29500 "
        "(errno: 97 - Address family not supported by protocol).",
        "misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
        "worker:1:1 [0] NCCL INFO NET/IB : No device found.",
        "Warning: WARNING: destroy_process_group() was not called before program exit, which can "
        "leak resources.",
    ]
    assert explain_lines(lines) == []


def test_a_traceback_is_a_finding_for_its_rank_with_where_it_happened():
    lines = [
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/home/u/train.py", line 40, in <module>',
        "[rank3]:     main()",
        '[rank3]:   File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 9, '
        "in _call_impl",
        "[rank3]:     return forward_call(*args)",
        "[rank3]: ValueError: bad batch",
    ]
    (finding,) = explain_lines(lines)
    assert finding.id == "python.exception" and finding.ranks == (3,)
    assert "ValueError: bad batch at /home/u/train.py:40 in <module>" in finding.summary
    assert [e.line for e in finding.evidence] == [2, 6]


def test_ddpdoctors_own_wrapper_frame_is_not_where_the_user_raised():
    # a checkout of ddpdoctor is not under site-packages: its wrapper of a schedule's step()
    # sits between the user's call and torch's frames
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/u/train_pp.py", line 50, in main',
        "[rank1]:     schedule.step(target=y)",
        '[rank1]:   File "/src/ddpdoctor/ddpdoctor/runtime/pipeline_hooks.py", line 171, in step',
        "[rank1]:     return original(self, *args, **kwargs)",
        "[rank1]: RuntimeError: The size of tensor a (16) must match the size of tensor b (4)",
    ]
    (finding,) = explain_lines(lines)
    assert "at /home/u/train_pp.py:50 in main" in finding.summary, finding.summary


def test_a_chained_exception_reports_the_last_one_with_its_cause():
    lines = [
        "Traceback (most recent call last):",
        '  File "/app/a.py", line 1, in <module>',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/app/a.py", line 3, in <module>',
        "RuntimeError: config incomplete",
    ]
    (finding,) = explain_lines(lines)
    assert "RuntimeError: config incomplete" in finding.summary
    assert [e.line for e in finding.evidence] == [3, 8, 9]


def test_the_same_exception_on_every_rank_is_one_finding():
    lines = []
    for rank in (0, 1):
        lines += [
            f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/app/t.py", line 5, in <module>',
            f"[rank{rank}]: OSError: [Errno 28] No space left on device: '/ckpt/{rank}.pt'",
        ]
    (finding,) = explain_lines(lines)
    assert finding.ranks == (0, 1)


def test_keyboard_interrupt_is_information():
    lines = [
        "Traceback (most recent call last):",
        '  File "/a.py", line 1, in f',
        "KeyboardInterrupt",
    ]
    (finding,) = explain_lines(lines)
    assert (finding.id, finding.severity) == ("python.interrupted", Severity.INFO)


def test_a_consequence_alone_is_an_error_and_next_to_a_root_cause_a_warning():
    closed = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:4000. Remote crash."
    assert explain_lines([closed])[0].severity is Severity.ERROR
    root = "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 4 params, while "
    root += "rank 0 has inconsistent 2 params."
    found = by_id(explain_lines([root, closed]))
    assert found["gloo.peer_closed"].severity is Severity.WARNING
    assert found["ddp.model_mismatch"].ranks == (0, 1)


def test_a_log_path_names_the_local_rank():
    lines = ["Traceback (most recent call last):", '  File "/a.py", line 1, in f', "OSError: x"]
    (finding,) = explain_lines(lines, file="run/logs/vm/none_1/attempt_0/1/stderr.log")
    assert finding.ranks == (1,)
    assert finding.evidence[0].file == "run/logs/vm/none_1/attempt_0/1/stderr.log"


def test_a_run_directory_maps_local_ranks_and_nccl_files_to_global_ranks(tmp_path):
    run = tmp_path / "run"
    (run / "events").mkdir(parents=True)
    hello = {"v": 1, "t": 1.0, "mono": 1.0, "rank": 5, "kind": "hello", "host": "nodeB"}
    hello.update(local_rank=1, pid=4242)
    (run / "events" / "rank-5.jsonl").write_text(json.dumps(hello) + "\n")
    log = run / "logs" / "nodeB" / "none_x" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text('Traceback (most recent call last):\n  File "/a.py", line 1, in f\nOSError: x\n')
    (run / "nccl").mkdir()
    (run / "nccl" / "nodeB.4242.log").write_text(
        "nodeB:4242:4300 [1] NCCL WARN Duplicate GPU detected : rank 5 and rank 4 both on CUDA "
        "device 3000\nnodeB:4242:4300 [1] NCCL WARN something odd\n"
    )
    (run / "stacks").mkdir()
    (run / "stacks" / "rank-5.json").write_text("[]")  # not a log: never read
    found = by_id(explain_files([run]))
    assert found["python.exception"].ranks == (5,)
    assert found["nccl.warn"].ranks == (5,)
    assert set(found) == {"python.exception", "nccl.warn", "nccl.duplicate_gpu"}


def test_a_plain_directory_is_read_file_by_file(tmp_path):
    (tmp_path / "a.log").write_text(
        "init.cc:1247 NCCL WARN Mismatched collective detected, "
        "please check your collective calls at and around rank 3\n"
    )
    (tmp_path / ".hidden.log").write_text("NCCL WARN ignored\n")
    assert ids(explain_files([tmp_path])) == ["nccl.mismatched_collective"]


def test_a_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        explain_files([tmp_path / "nope.log"])


def test_an_unreadable_file_is_a_usage_error(tmp_path, monkeypatch):
    path = tmp_path / "secret.log"
    path.write_text("x\n")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads any mode: make the open fail as it would for a user
        real_open = type(path).open

        def denied(self, *args, **kwargs):
            if self == path:
                raise PermissionError(13, "Permission denied")
            return real_open(self, *args, **kwargs)

        monkeypatch.setattr(type(path), "open", denied)
    with pytest.raises(UsageError, match=r"cannot read .*Permission denied"):
        explain_files([path])


def test_binary_junk_and_a_huge_line_are_read_in_bounded_memory(tmp_path):
    path = tmp_path / "junk.log"
    with path.open("wb") as out:
        out.write(bytes(b for b in range(256) if b != ord("\n")) * 8 + b"\n")
        out.write(b"x" * (8 * 1024 * 1024))  # one 8 MiB line
        out.write(
            b"\nh:1:2 [0] include/socket.h:390 NCCL WARN Connect to 1.2.3.4<5> failed : \xff\n"
        )
    tracemalloc.start()
    try:
        findings = explain_files([path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    (finding,) = [f for f in findings if f.id == "nccl.connect_failed"]
    assert finding.evidence[0].line == 3
    assert all(len(e.text) <= 2001 for f in findings for e in f.evidence)


def test_a_file_given_twice_is_read_once(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(
        "init.cc:497 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1\n"
    )
    (finding,) = explain_files([log, tmp_path, log])
    assert len(finding.evidence) == 1


def test_torchrun_that_cannot_resolve_its_rendezvous_host_is_explained(tmp_path):
    """torchrun --rdzv-endpoint=NAME:PORT where NAME does not resolve on this node: its own
    traceback ends in `socket.gaierror` (a lower-case exception class), which said nothing before."""
    log = tmp_path / "torchrun.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/usr/bin/torchrun", line 8, in <module>\n'
        "    sys.exit(main())\n"
        '  File "/site-packages/torch/distributed/elastic/rendezvous/utils.py", line 189, in '
        "_matches_machine_hostname\n"
        "    host_addr_list = socket.getaddrinfo(\n"
        "socket.gaierror: [Errno -2] Name or service not known\n"
    )
    (finding,) = explain_files([log])
    assert finding.id == "c10d.host_unknown" and finding.severity.value == "error"
    assert finding.evidence[-1].line == 6


def test_a_lower_case_exception_class_ends_a_traceback(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/home/me/train.py", line 12, in main\n'
        "    conn.recv(4)\n"
        "socket.timeout: timed out\n"
    )
    (finding,) = explain_files([log])
    assert finding.id == "python.exception"
    assert "socket.timeout: timed out" in finding.summary and "train.py:12" in finding.summary


def _two_agents_on_one_host(tmp_path, *, ppid: bool):
    """A 2-node job whose two torchrun agents ran on one host, 2 ranks each: each agent's logs
    below its own node-<N> folder, local ranks 0 and 1 under both."""
    run = tmp_path / "run"
    (run / "events").mkdir(parents=True)
    for node in (0, 1):
        agent_pid = 700 + node
        if ppid:  # the launcher's record of each node: its host and torchrun's pid
            record = NodeRecord(node, "vm", 600 + node, torchrun_pid=agent_pid, nproc=2)
            write_node_record(RunDir(run), record)
        for local in (0, 1):
            rank = 2 * node + local
            hello = {"v": 1, "t": 1.0, "mono": 1.0, "rank": rank, "kind": "hello", "host": "vm"}
            hello.update(local_rank=local, pid=800 + rank, ppid=agent_pid)
            if not ppid:
                hello["group_rank"] = node
            (run / "events" / f"rank-{rank}.jsonl").write_text(json.dumps(hello) + "\n")
    log = run / "logs" / "vm" / "node-1" / "none_x" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text('Traceback (most recent call last):\n  File "/a.py", line 1, in f\nOSError: x\n')
    return run


@pytest.mark.parametrize("ppid", [True, False], ids=["node-records", "group-rank"])
def test_two_agents_on_one_host_map_their_local_ranks_by_node(tmp_path, ppid):
    # node 1's local rank 0 is global rank 2, not node 0's rank 0 (both are "vm", local 0)
    run = _two_agents_on_one_host(tmp_path, ppid=ppid)
    found = by_id(explain_files([run]))
    assert found["python.exception"].ranks == (2,)


def test_a_local_rank_no_hello_of_its_node_names_is_no_other_nodes_rank(tmp_path):
    # node 1's local rank 0 never said hello: its log is nobody's, not node 0's rank 0
    run = _two_agents_on_one_host(tmp_path, ppid=False)
    (run / "events" / "rank-2.jsonl").unlink()
    found = by_id(explain_files([run]))
    assert found["python.exception"].ranks == ()
