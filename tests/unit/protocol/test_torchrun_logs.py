from __future__ import annotations

from ddpdoctor.protocol.torchrun_logs import (
    AGENT_LOG,
    OTHER_LOG,
    RANK_LOG,
    AgentLogParser,
    classify_log_path,
    signal_name,
)

# torchrun 2.14's output after rank 1 was SIGKILLed on a 2-rank gloo run (captured on this machine).
TABLE = """\
[default1]:rank 1 step done
W1122 04:09:55.483000 8477 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 8481 closing signal SIGTERM
E1122 04:09:55.582000 8477 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 8482) of binary: /work/main/.venv/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
crash.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_04:09:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 8481)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 8481
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_04:09:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 8482)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8482
======================================================
"""


def test_failure_table_gives_exit_codes_signals_and_ranks():
    parser = AgentLogParser()
    for n, line in enumerate(TABLE.splitlines(), 1):
        parser.feed(line, n)
    killed = parser.exits[8482]
    assert (killed.rank, killed.local_rank, killed.exit_code) == (1, 1, -9)
    assert killed.signal == "SIGKILL" and killed.root_cause and killed.line_no == 22
    stopped = parser.exits[8481]
    assert (stopped.rank, stopped.exit_code, stopped.signal) == (0, -15, "SIGTERM")
    assert not stopped.root_cause
    assert parser.signalled_pids == {8481: "SIGTERM"}


def test_failed_line_alone_is_enough_for_the_exit_code():
    parser = AgentLogParser()
    parser.feed(TABLE.splitlines()[2], 3)
    assert parser.exits[8482].exit_code == -9 and parser.exits[8482].rank is None


def test_paths_of_a_run_directory():
    rank = classify_log_path(("logs", "vm", "none_x1", "attempt_2", "3", "stdout.log"))
    assert (rank.kind, rank.host, rank.local_rank, rank.attempt, rank.stream) == (
        RANK_LOG,
        "vm",
        3,
        2,
        "stdout",
    )
    assert rank.label(7) == "rank 7 stdout" and rank.label(None) == "local rank 3 stdout"
    assert classify_log_path(("logs", "vm", "torchrun.log")).kind == AGENT_LOG
    assert classify_log_path(("logs", "vm", "notes.log")).kind == OTHER_LOG
    assert classify_log_path(("nccl", "node-1.example.com.99.log")).pid == 99
    assert classify_log_path(("logs", "vm", "error.json")) is None


def test_signal_names():
    assert signal_name(-9) == "SIGKILL" and signal_name(137) == "SIGKILL"
    assert signal_name(1) is None and signal_name(None) is None and signal_name(0) is None
