"""A run its launcher restarts (torchrun --max-restarts): attempts in the model, the recovery rule.

Events as torchrun's ranks write them: each process says hello with TORCHELASTIC_RESTART_COUNT
(`restart_count`) and TORCHELASTIC_MAX_RESTARTS (`max_restarts`); a restart appends the new
processes' events to the same per-rank files."""

from __future__ import annotations

import json

from ddpdoctor.findings import Severity
from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.model.attempt_views import budget_in_argv
from ddpdoctor.monitor.model.snapshot import RankState, RunInfo, Snapshot, Verdict
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.tell.diagnosis_text import rank_line, status_line
from ddpdoctor.tui.header import title_line
from ddpdoctor.tui.table_model import rank_row
from tests.unit.monitor.test_monitor_builders import NOW, Stream

LINE = {"file": "/job/train.py", "line": 27, "function": "read_batch"}


def attempt(s: Stream, number: int, t: float, budget: int | None = 2) -> None:
    for r in range(s.world):
        fields = {"restart_count": number} if budget is not None else {}
        if budget is not None:
            fields["max_restarts"] = budget
        s.ev(
            r,
            t,
            "hello",
            local_rank=r,
            world_size=s.world,
            host="node0",
            pid=5000 + 10 * number + r,
            **fields,
        )
        s.ev(r, t + 0.01, "phase", phase="train")


def fail(s: Stream, t: float, rank: int = 1) -> None:
    """`rank` raises; the other fails as a consequence ("Connection closed by peer")."""
    s.ev(rank, t, "error", exc_type="LoaderError", message="shard 10 unreadable", location=LINE)
    s.ev(rank, t + 0.01, "exit", code=1, reason="exception")
    for r in range(s.world):
        if r != rank:
            s.ev(r, t + 0.5, "error", exc_type="RuntimeError", message="Connection closed by peer")
            s.ev(r, t + 0.51, "exit", code=1, reason="exception")


def finish(s: Stream, t: float) -> None:
    for r in range(s.world):
        s.ev(r, t, "exit", code=0, reason="normal")


def judged(s: Stream, until: float, *, live: bool = True) -> Snapshot:
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=s.world))
    events = sorted((e for evs in s.events.values() for e in evs), key=lambda e: e["t"])
    for n, event in enumerate(events, 1):
        if event["t"] <= NOW + until:
            state.apply(event, (f"events/rank-{event['rank']}.jsonl", n))
    snap = state.snapshot(NOW + until, live=live)
    return apply_diagnosis(snap, diagnose(snap))


def test_a_failure_with_restarts_left_is_a_warning_and_never_a_stop():
    s = Stream()
    attempt(s, 0, 0.0)
    t = s.steps(10)
    fail(s, t)
    snap = judged(s, t + 2.0)
    assert snap.verdict is Verdict.RUNNING and not snap.confirmed  # the stop policy acts on neither
    head = snap.findings[0]
    assert head.id == "run.restarting" and head.severity is Severity.WARNING
    assert head.ranks == (1,) and "LoaderError" in head.summary and "train.py:27" in head.summary
    assert "attempt 1 of 3" in head.summary and "2 restarts left" in head.summary
    assert "attempt 1 of 3" in status_line(snap)


def test_a_restart_whose_ranks_do_not_join_says_so_with_the_likely_cause_never_a_stop():
    """torchrun's c10d rendezvous shares its store across restarts: the next attempt's ranks can
    wait in init_process_group for peers of the last one (a stack shows gloo's
    connectFullMesh). Two minutes after the failure with no rank of it heard, the warning says
    so, with the variable that gives each attempt its own store; the job is never stopped."""
    s = Stream()
    attempt(s, 0, 0.0)
    t = s.steps(10)
    fail(s, t)
    soon = judged(s, t + 30.0)
    assert "joined" not in soon.findings[0].summary
    late = judged(s, t + 150.0)
    assert late.verdict is Verdict.RUNNING and not late.confirmed
    head = late.findings[0]
    assert head.id == "run.restarting" and head.severity is Severity.WARNING
    assert "no rank of the next attempt has joined a process group" in head.summary
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in head.fix


def test_the_next_attempt_is_the_same_ranks_and_a_recovered_run_is_healthy():
    s = Stream()
    attempt(s, 0, 0.0)
    t = s.steps(10)
    fail(s, t)
    attempt(s, 1, t + 20.0)
    during = judged(s, t + 20.5)
    assert during.verdict is Verdict.RUNNING
    assert [v.state for v in during.ranks] == [RankState.RUNNING, RankState.RUNNING]
    assert [v.restarts for v in during.ranks] == [1, 1]
    assert "restarted 1×" in rank_line(during.ranks[0]).plain
    assert "attempt 2 of 3" in title_line(during, None).plain  # the TUI's header
    row = rank_row(during.ranks[0], None, False)
    assert row.cells[0][0].endswith("↻1")  # the rank's row in the TUI shows its restarts
    t2 = s.steps(10, t=t + 21.0)
    finish(s, t2 + 0.1)
    end = judged(s, t2 + 0.5)
    assert end.verdict is Verdict.HEALTHY and not end.culprits
    recovered = next(f for f in end.findings if f.id == "run.recovered")
    assert recovered.severity is Severity.WARNING and recovered.ranks == (1,)
    assert "attempt 2 of 3" in recovered.summary
    assert (
        "rank 1: LoaderError: shard 10 unreadable at train.py:27 in read_batch" in recovered.summary
    )
    assert not [f for f in end.findings if f.severity is Severity.ERROR]
    data = end.diagnosis_json()["attempts"]
    assert data["current"] == 2 and data["total"] == 3 and data["recovered"] is True
    first = data["attempts"][0]
    assert first["steps"] == 10 and first["duration_s"] is not None
    assert (
        first["endings"][0]["rank"] == 1
        and first["endings"][0]["line"] == "train.py:27 in read_batch"
    )
    json.dumps(end.diagnosis_json())


def test_a_rank_not_yet_restarted_is_the_restart_under_way_not_a_crash():
    s = Stream()
    attempt(s, 0, 0.0)
    t = s.steps(5)
    fail(s, t)
    s.ev(
        0,
        t + 20.0,
        "hello",
        local_rank=0,
        world_size=2,
        host="node0",
        pid=5010,
        restart_count=1,
        max_restarts=1,
    )
    snap = judged(s, t + 20.5)
    assert snap.verdict is Verdict.RUNNING and not snap.confirmed
    assert snap.ranks[0].state is not RankState.GONE


def test_a_spent_budget_is_a_crash_of_the_last_attempt_with_the_earlier_ones_listed():
    s = Stream()
    attempt(s, 0, 0.0, budget=1)
    t = s.steps(5)
    fail(s, t)
    attempt(s, 1, t + 20.0, budget=1)
    t2 = s.steps(3, t=t + 21.0)
    fail(s, t2)
    snap = judged(s, t2 + 2.0)
    assert snap.verdict is Verdict.CRASH and snap.culprits == frozenset({1})
    assert snap.findings[0].id == "crash" or "LoaderError" in snap.findings[0].summary
    earlier = next(f for f in snap.findings if f.id == "run.attempts")
    assert "attempt 1 of 2" in earlier.summary and "train.py:27" in earlier.summary


def test_without_a_budget_a_failure_is_a_crash_as_before():
    s = Stream()
    attempt(s, 0, 0.0, budget=0)
    t = s.steps(5)
    fail(s, t)
    snap = judged(s, t + 2.0)
    assert snap.verdict is Verdict.CRASH and snap.culprits == frozenset({1})
    assert snap.attempts is None  # one attempt, no budget: nothing to tell


def test_a_new_process_of_a_rank_seen_dead_is_looked_at_anew():
    s = Stream()
    attempt(s, 0, 0.0)
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2))
    for event in s.events[0]:
        state.apply(event)
    state.set_alive(0, False)  # its process of attempt 1 died (SIGKILL: no exit event)
    state.apply(
        {
            "v": 1,
            "t": NOW + 30,
            "rank": 0,
            "kind": "hello",
            "pid": 9999,
            "restart_count": 1,
            "max_restarts": 2,
            "host": "node0",
            "local_rank": 0,
        }
    )
    assert 0 not in state.alive  # not "dead stays dead": the new pid is checked
    ending = state.attempts.endings[0][0]
    assert ending.failed and "without an exit event" in ending.cause


def test_the_budget_from_a_torchrun_command_line():
    assert budget_in_argv(["torchrun", "--max-restarts", "3", "train.py"]) == 3
    assert budget_in_argv(["torchrun", "--max_restarts=2", "train.py"]) == 2
    assert budget_in_argv(["torchrun", "--max-restarts", "x"]) is None
    assert budget_in_argv(["python", "train.py", "--max-restarts"]) is None
    assert budget_in_argv(["torchrun", "--max-restarts", "99999999999"]) is None
    assert budget_in_argv(["python", "-m", "torch.distributed.run", "--max-restarts", "1"]) == 1
    assert budget_in_argv(["torchrun", "train.py", "--max-restarts", "5"]) is None


def test_the_report_marks_each_attempt_on_the_timeline():
    from ddpdoctor.report.timeline import RankTimeline, Timeline, add_attempts
    from ddpdoctor.report.trace import trace_events

    timeline = Timeline({0: RankTimeline(0, last_t=NOW + 50)}, start=NOW)
    first = {"attempt": 1, "started_t": NOW, "ended_t": NOW + 20,
             "endings": [{"rank": 1, "failed": True, "cause": "LoaderError: x"}]}  # fmt: skip
    second = {"attempt": 2, "started_t": NOW + 20, "ended_t": None, "endings": []}
    add_attempts(timeline, {"attempts": {"total": 3, "attempts": [first, second, "junk"]}})
    names = [s.name for s in timeline.spans if s.kind == "attempt"]
    assert names == ["attempt 1 of 3 (failed: rank 1: LoaderError: x)", "attempt 2 of 3 (ran on)"]
    marks = [e for e in trace_events(timeline)["traceEvents"] if e.get("cat") == "attempt"]
    assert [m["dur"] for m in marks] == [20e6, 30e6]


def test_a_ray_train_retry_is_the_next_attempt_of_the_same_world_ranks():
    """Ray Train's FailureConfig(max_failures=1): the budget comes with the training function's
    start (ray_call), a new worker group's processes are the ranks' next attempt."""
    s = Stream()
    for r in range(2):
        s.ev(r, 0.0, "hello", local_rank=r, world_size=2, host="node0", pid=6000 + r)
        s.ev(r, 0.1, "ray_call", state="busy", call="train_fn", max_failures=1)
    t = s.steps(3)
    fail(s, t)
    held = judged(s, t + 2.0)
    assert held.verdict is Verdict.RUNNING and not held.confirmed
    assert held.findings[0].id == "run.restarting" and "attempt 1 of 2" in held.findings[0].summary
    for r in range(2):
        s.ev(r, t + 30.0, "hello", local_rank=r, world_size=2, host="node0", pid=6100 + r)
    t2 = s.steps(3, t=t + 31.0)
    finish(s, t2 + 0.1)
    end = judged(s, t2 + 0.5)
    assert end.verdict is Verdict.HEALTHY and end.attempts is not None
    assert end.attempts.budget_from == "Ray Train FailureConfig(max_failures)"
    assert any(f.id == "run.recovered" for f in end.findings)


def test_a_ray_worker_killed_in_its_training_function_is_named_as_such():
    """A SIGKILLed Ray worker leaves no exit event, and Ray's raylet reports only a lost
    connection: the attempt's failure says the worker was killed while running its training
    function (never that it finished), and the retry is recovery."""
    s = Stream()
    for r in range(2):
        s.ev(r, 0.0, "hello", local_rank=r, world_size=2, host="node0", pid=6000 + r)
        s.ev(r, 0.1, "ray_call", state="busy", call="train_fn", max_failures=1)
    t = s.steps(3)  # rank 1 vanishes here: no event; the group is ended 2 s later
    for r in range(2):
        s.ev(r, t + 30.0, "hello", local_rank=r, world_size=2, host="node0", pid=6100 + r)
    t2 = s.steps(3, t=t + 31.0)
    finish(s, t2 + 0.1)
    end = judged(s, t2 + 0.5)
    assert end.verdict is Verdict.HEALTHY and end.attempts is not None
    recovered = next(f for f in end.findings if f.id == "run.recovered")
    assert "killed while running its training function" in recovered.summary
    assert recovered.severity is Severity.WARNING


def test_while_the_launcher_restarts_the_logs_errors_are_warnings_of_that_attempt():
    """torchrun's log has the failed rank's traceback and its failure table while the next
    attempt starts: a job that recovers is never shown with errors (nor a crash)."""
    from ddpdoctor.findings import Finding

    s = Stream()
    attempt(s, 0, 0.0)
    t = s.steps(10)
    fail(s, t)
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2))
    for event in sorted((e for evs in s.events.values() for e in evs), key=lambda e: e["t"]):
        state.apply(event)
    snap = state.snapshot(NOW + t + 2.0, live=True)
    logged = [
        Finding("python.exception", Severity.ERROR, "Rank 1 raised LoaderError: x", "fix"),
        Finding("torchrun.failed", Severity.ERROR, "Rank 1 (pid 5001) exited with code 1", ""),
    ]
    diag = diagnose(snap, extra_findings=logged)
    assert diag.verdict is Verdict.RUNNING
    assert [f.severity for f in diag.findings] == [Severity.WARNING] * len(diag.findings)
    told = [f for f in diag.findings if f.id in ("python.exception", "torchrun.failed")]
    assert len(told) == 2
    assert all(f.summary.startswith("in the attempt the launcher restarts: ") for f in told)
    spent = Stream()  # no restart left: the same errors stay errors, beside the crash
    attempt(spent, 0, 0.0, budget=0)
    t = spent.steps(10)
    fail(spent, t)
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=2))
    for event in sorted((e for evs in spent.events.values() for e in evs), key=lambda e: e["t"]):
        state.apply(event)
    crashed = diagnose(state.snapshot(NOW + t + 2.0, live=True), extra_findings=logged)
    assert crashed.verdict is Verdict.CRASH
    assert {f.severity for f in crashed.findings if f.id in ("python.exception",)} == {
        Severity.ERROR
    }
