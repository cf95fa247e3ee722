"""capture_stacks with recorded py-spy outputs (injected runner): files, fallbacks, errors, findings."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from ddpdoctor.stacks import capture as stacks
from ddpdoctor.stacks.capture import (
    CommandResult,
    PtraceFacts,
    capture_stacks,
    find_pyspy,
    group_stacks,
    load_capture,
    read_ptrace_facts,
    run_command,
)
from tests.procs import REPO

RECORDED = REPO / "tests" / "fixtures" / "stacks" / "gloo-barrier-vs-sleep"
DUMPS = {0: (RECORDED / "rank-0.json").read_text(), 1: (RECORDED / "rank-1.json").read_text()}
PIDS = {0: 24641, 1: 24642}
OPEN = PtraceFacts(yama_scope=None, cap_sys_ptrace=True, euid=0)
# py-spy 0.4.3's own words when it may not attach (recorded running it as `nobody` on a root pid)
DENIED = "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n"
GONE = (
    "Error: Failed to get process executable name. Check that the process is running.\n\n"
    "Caused by:\n    0: No such file or directory (os error 2)\n"
)


class Recorder:
    """A py-spy stand-in: answers from a table keyed by (pid, native) and records every call."""

    def __init__(self, answers):
        self.answers = answers
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, cmd, timeout):
        with self.lock:
            self.calls.append(list(cmd))
        pid = int(cmd[cmd.index("--pid") + 1])
        return self.answers[(pid, "--native" in cmd)]


def ok(rank: int) -> CommandResult:
    return CommandResult(0, DUMPS[rank], "")


def capture(tmp_path, answers, **kwargs):
    runner = Recorder(answers)
    result = capture_stacks(
        tmp_path / "run", PIDS, runner=runner, pyspy="/bin/py-spy", ptrace=OPEN, **kwargs
    )
    return result, runner


def test_every_rank_is_dumped_and_stored(tmp_path):
    result, runner = capture(tmp_path, {(24641, True): ok(0), (24642, True): ok(1)})
    assert sorted(runner.calls) == [
        ["/bin/py-spy", "dump", "--json", "--pid", "24641", "--native"],
        ["/bin/py-spy", "dump", "--json", "--pid", "24642", "--native"],
    ]
    assert result.errors == {} and result.findings == ()
    assert all(r.native for r in result.ranks)
    folder = tmp_path / "run" / "stacks" / result.capture_id
    assert result.path == str(folder)
    assert (folder / "rank-0.json").read_text() == DUMPS[0]
    summary = json.loads((folder / "capture.json").read_text())
    assert [(r["rank"], r["pid"], r["ok"]) for r in summary["ranks"]] == [
        (0, 24641, True),
        (1, 24642, True),
    ]
    assert group_stacks(load_capture(folder)) == group_stacks(result)


def test_a_failed_native_dump_is_retried_without_native(tmp_path):
    unwind = CommandResult(1, "", "Error: Failed to unwind native stack\n")
    result, runner = capture(
        tmp_path,
        {(24641, True): unwind, (24641, False): ok(0), (24642, True): ok(1)},
    )
    assert result.errors == {}
    assert [r.native for r in result.ranks] == [False, True]
    assert len(runner.calls) == 3


def test_ptrace_denied_is_a_finding_with_the_fix(tmp_path):
    denied = CommandResult(1, "", DENIED)
    facts = PtraceFacts(yama_scope=1, cap_sys_ptrace=False, euid=1000)
    runner = Recorder({(24641, True): denied, (24642, True): denied})
    result = capture_stacks(tmp_path / "run", PIDS, runner=runner, pyspy="py-spy", ptrace=facts)
    (finding,) = result.findings
    assert finding.id == "stacks.ptrace_denied" and finding.ranks == (0, 1)
    assert "ptrace_scope is 1" in finding.summary and "Permission Denied" in finding.summary
    for remedy in ("--cap-add SYS_PTRACE", "kernel.yama.ptrace_scope=0", "root"):
        assert remedy in finding.fix
    assert all(r.denied for r in result.ranks)
    assert len(runner.calls) == 2  # no pointless retry without --native
    stored = load_capture(result.path)
    assert [f.id for f in stored.findings] == ["stacks.ptrace_denied"]
    assert all(r.denied for r in stored.ranks)


def test_a_kernel_that_forbids_ptrace_is_reported_without_running_py_spy(tmp_path):
    facts = PtraceFacts(yama_scope=3, cap_sys_ptrace=True, euid=0)
    runner = Recorder({})
    result = capture_stacks(tmp_path / "run", PIDS, runner=runner, pyspy="py-spy", ptrace=facts)
    assert runner.calls == []
    assert [f.id for f in result.findings] == ["stacks.ptrace_denied"]
    assert "no process may attach" in result.findings[0].summary


def test_gone_and_slow_ranks_are_per_rank_errors(tmp_path):
    result, _ = capture(
        tmp_path,
        {
            (24641, True): CommandResult(1, "", GONE),
            (24642, True): CommandResult(None, "", "", timed_out=True),
        },
        timeout_s=2,
    )
    assert result.errors == {
        0: "process 24641 not found (it exited)",
        1: "py-spy did not answer within 2 s",
    }
    (finding,) = result.findings
    assert finding.id == "stacks.capture_failed" and finding.ranks == (0, 1)
    assert group_stacks(result) == ()


def test_py_spy_missing_is_a_finding(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "find_pyspy", lambda: None)
    result = capture_stacks(tmp_path / "run", PIDS, ptrace=OPEN)
    (finding,) = result.findings
    assert finding.id == "stacks.pyspy_missing" and "pip install py-spy" in finding.fix
    assert set(result.errors) == {0, 1}


def test_ranks_are_dumped_in_parallel(tmp_path):
    everyone_in = threading.Barrier(4, timeout=10)  # only passes if all 4 dumps run at once

    def runner(cmd, timeout):
        everyone_in.wait()
        return ok(0)

    targets = {rank: 1000 + rank for rank in range(4)}
    result = capture_stacks(tmp_path / "run", targets, runner=runner, pyspy="p", ptrace=OPEN)
    assert result.errors == {}


def test_two_captures_in_the_same_second_get_their_own_folders(tmp_path):
    first, _ = capture(tmp_path, {(24641, True): ok(0), (24642, True): ok(1)})
    second, _ = capture(tmp_path, {(24641, True): ok(0), (24642, True): ok(1)})
    assert first.path != second.path


def test_ptrace_facts_are_read_from_proc(tmp_path):
    (tmp_path / "sys" / "kernel" / "yama").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("2\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tx\nCapEff:\t0000000000080000\n")
    facts = read_ptrace_facts(tmp_path)
    assert (facts.yama_scope, facts.cap_sys_ptrace) == (2, True)
    assert not facts.blocks_everyone()
    (tmp_path / "self" / "status").write_text("CapEff:\t0000000000000000\n")
    assert read_ptrace_facts(tmp_path).blocks_everyone()
    assert read_ptrace_facts(tmp_path / "nothing").yama_scope is None


def test_py_spy_is_found_next_to_this_python(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    found = find_pyspy()
    assert found is not None
    assert Path(found).parent in (Path(sys.executable).parent, Path(sys.prefix) / "bin")


def test_run_command_kills_what_overruns():
    result = run_command(["sleep", "30"], 0.2)
    assert result.timed_out and result.returncode is None


@pytest.mark.parametrize("code", [0, 3])
def test_run_command_returns_output_and_code(code):
    result = run_command(["sh", "-c", f"echo hi; exit {code}"], 30)
    assert (result.returncode, result.stdout.strip(), result.timed_out) == (code, "hi", False)


def test_a_py_spy_that_cannot_run_is_a_per_rank_error(tmp_path):
    result = capture_stacks(
        tmp_path / "run", {0: 1}, pyspy=str(tmp_path / "no-such-py-spy"), ptrace=OPEN
    )
    assert result.errors[0].startswith("cannot run py-spy:")
    assert [f.id for f in result.findings] == ["stacks.capture_failed"]
