from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.model.snapshot import RankState, StackGroup, Verdict
from ddpdoctor.monitor.tell.headless import HeadlessView
from tests.unit.monitor.test_monitor_builders import NOW, snap, view, waiting


def console(terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200, color_system=None), out


def hung():
    s = snap(
        [waiting(0, 41, 8.0), view(1, seq=40, last_progress_t=NOW - 9.0, last_event="fault hang")]
    )
    return apply_diagnosis(s, diagnose(s))


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_status_line_every_few_seconds_without_a_terminal():
    con, out = console()
    clock = Clock()
    view_ = HeadlessView(con, live=False, status_every_s=5.0, clock=clock)
    healthy = snap([view(0, step_time_s=0.1, loss=2.0), view(1, step_time_s=0.1, loss=2.2)])
    view_.update(healthy)
    clock.t = 2.0
    view_.update(healthy)
    clock.t = 5.5
    view_.update(healthy)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0] == "running · step 10 · 0.100 s/step · loss 2.1 · 2 running"


def test_the_diagnosis_is_printed_at_once_and_once():
    con, out = console()
    view_ = HeadlessView(con, live=False, clock=Clock())
    problem = hung()
    view_.update(problem)
    view_.update(problem)
    text = out.getvalue()
    assert text.count("HANG: culprit rank 1") == 1
    assert "rank 1 never reached all_reduce #41" in text and "fix: Every rank must" in text
    assert "← culprit" in text and "waits on rank 1" in text


def test_stacks_follow_when_py_spy_delivers_them_and_close_adds_the_verdict():
    con, out = console()
    view_ = HeadlessView(con, live=False, clock=Clock())
    problem = hung()
    view_.update(problem)
    stacks = (
        StackGroup((0,), ("train.py:10 main", "distributed_c10d.py:2500 all_reduce")),
        StackGroup((1,), ("train.py:10 main", "train.py:120 _inject_hang")),
    )
    view_.update(replace(problem, stacks=stacks))
    text = out.getvalue()
    assert "Stacks (py-spy, innermost last):" in text
    assert "rank 1 (1) — culprit" in text and "train.py:120 _inject_hang" in text
    view_.close(replace(problem, stacks=stacks))
    final = out.getvalue()[len(text) :]
    assert final.strip().splitlines()[-1].startswith("HANG: culprit rank 1")
    assert "Stacks" not in final  # not printed twice


def test_close_of_a_healthy_run():
    con, out = console()
    view_ = HeadlessView(con, live=False, clock=Clock())
    done = snap(
        [view(0, RankState.DONE, exit_code=0), view(1, RankState.DONE, exit_code=0)],
        verdict=Verdict.HEALTHY,
    )
    view_.close(done)
    assert out.getvalue().strip() == "HEALTHY: all 2 ranks finished"


def test_a_bar_per_rank_on_a_terminal():
    con, out = console(terminal=True)
    view_ = HeadlessView(con, live=True)
    ranks = [view(r, step=12, total_steps=40, step_time_s=0.05) for r in range(2)]
    view_.update(snap(ranks))
    view_.close(snap(ranks))
    text = out.getvalue()
    assert "rank 0" in text and "rank 1" in text and "12/40" in text and "0.050 s/step" in text


def test_many_ranks_get_a_bar_per_host():
    con, out = console(terminal=True)
    view_ = HeadlessView(con, live=True)
    ranks = [view(r, host=f"node{r // 8}", step=5 + r % 3, total_steps=40) for r in range(64)]
    view_.update(snap(ranks))
    view_.close(snap(ranks))
    text = out.getvalue()
    assert "node7 (8)" in text and "steps 5-7" in text and "rank 63" not in text


def test_job_output_passes_through_untouched():
    con, out = console()
    HeadlessView(con, live=False).job_output("[default0]:loss [red]1.0[/red] :smile:\n")
    assert out.getvalue() == "[default0]:loss [red]1.0[/red] :smile:\n"


def test_job_output_keeps_the_jobs_own_control_codes():
    # colours and a carriage return of the job's progress bar, as the job wrote them
    line = "[default1]:\x1b[32mepoch 1\x1b[0m 50%\r 60%\tloss 0.3"
    con, out = console()
    HeadlessView(con, live=False).job_output(line + "\n")
    assert out.getvalue() == line + "\n"


def _busy_wait(waited: float):
    from ddpdoctor.monitor.model.snapshot import Activity
    from ddpdoctor.protocol.verdicts import ActivityState
    from tests.unit.monitor.test_rules_wait import pg_thresholds

    busy = Activity(ActivityState.BUSY, 99.0, "train.py:88 evaluate", waited)
    s = snap([view(0, seq=40, activity=busy), waiting(1, 41, waited)])
    s = replace(s, thresholds=pg_thresholds(timeout=600.0))
    return apply_diagnosis(s, diagnose(s))


def test_a_wait_for_a_busy_rank_is_in_the_status_line_and_printed_as_it_escalates():
    con, out = console()
    clock = Clock()
    view_ = HeadlessView(con, live=False, status_every_s=5.0, clock=clock)
    view_.update(_busy_wait(20.0))
    first = out.getvalue()
    assert "rank 1 waits 20 s for rank 0, busy in train.py:88 evaluate (CPU 99%)" in first
    assert "wait.busy_rank" not in first and "HANG" not in first  # info: the status line only
    for waited in (70.0, 75.0, 500.0, 510.0):
        clock.t += 1
        view_.update(_busy_wait(waited))
    text = out.getvalue()
    assert text.count("wait.busy_rank") == 2  # once a warning, once an error
    assert "the process group times out in 100 s" in text
    assert "fix: Not a hang" in text
