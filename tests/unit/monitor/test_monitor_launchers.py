"""The launchers of a run (the processes that started its ranks and are no rank themselves), from
the ranks' hello events: in the snapshot, its JSON and the text view."""

from __future__ import annotations

import io

from rich.console import Console

from ddpdoctor.monitor.model.launchers import LauncherView, launcher_views
from ddpdoctor.monitor.model.snapshot import RunInfo
from ddpdoctor.monitor.model.state import RunState
from ddpdoctor.monitor.tell.headless import HeadlessView

SPAWN_PARENT = ["/venv/bin/python", "multigpu.py", "4", "2"]


def hello(rank: int, *, pid: int, ppid: int, argv, host="node-a", world_size=2, t=1.0) -> dict:
    return {
        "v": 1, "t": t, "mono": t, "rank": rank, "kind": "hello", "host": host, "pid": pid,
        "ppid": ppid, "world_size": world_size, "parent": {"pid": ppid, "argv": argv},
    }  # fmt: skip


def state_with(*events: dict, world_size=None) -> RunState:
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=world_size))
    for n, event in enumerate(events, 1):
        state.apply(event, (f"events/rank-{event['rank']}.jsonl", n))
    return state


def test_the_spawn_parent_is_one_launcher_of_both_ranks_and_the_world_is_two():
    state = state_with(
        hello(1, pid=11, ppid=10, argv=SPAWN_PARENT), hello(0, pid=12, ppid=10, argv=SPAWN_PARENT)
    )
    snap = state.snapshot(2.0)
    assert [v.rank for v in snap.ranks] == [0, 1]  # from the hellos: run.json gave no size
    assert snap.launchers == (LauncherView("node-a", 10, tuple(SPAWN_PARENT), (0, 1)),)
    assert snap.launchers[0].describe() == "python multigpu.py 4 2 (node-a:10) started ranks 0, 1"
    assert snap.diagnosis_json()["launchers"] == [
        {"host": "node-a", "pid": 10, "argv": SPAWN_PARENT, "ranks": [0, 1], "not_joined": None}
    ]


def test_one_launcher_per_node_ordered_by_rank():
    step = ["slurmstepd: [7.0]"]
    state = state_with(
        hello(2, pid=5, ppid=4, argv=step, host="b", world_size=4),
        hello(0, pid=5, ppid=4, argv=step, host="a", world_size=4),
        hello(1, pid=6, ppid=4, argv=step, host="a", world_size=4),
        hello(3, pid=6, ppid=4, argv=[], host="b", world_size=4),
    )
    views = launcher_views(state.ranks)
    assert [(v.host, v.ranks) for v in views] == [("a", (0, 1)), ("b", (2, 3))]
    assert views[0].label == "slurmstepd: [7.0]"
    assert LauncherView("h", 9, (), (0,)).label == "pid 9"


def test_old_hellos_without_a_parent_give_no_argv():
    event = hello(0, pid=3, ppid=2, argv=[], world_size=1)
    del event["parent"]
    assert state_with(event).snapshot(2.0).launchers == (LauncherView("node-a", 2, (), (0,)),)


def test_the_text_view_names_each_launcher_once_when_every_rank_is_in():
    out = io.StringIO()
    view = HeadlessView(Console(file=out, width=200, color_system=None), live=False)
    first = state_with(hello(0, pid=12, ppid=10, argv=SPAWN_PARENT))
    view.update(first.snapshot(2.0))
    assert "launcher:" not in out.getvalue()  # rank 1 has not said hello: wait for it
    both = state_with(
        hello(0, pid=12, ppid=10, argv=SPAWN_PARENT), hello(1, pid=11, ppid=10, argv=SPAWN_PARENT)
    )
    view.update(both.snapshot(2.0))
    view.close(both.snapshot(3.0))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("launcher:")]
    assert lines == ["launcher: python multigpu.py 4 2 (node-a:10) started ranks 0, 1"]


def test_an_mp_spawn_parents_report_of_the_stop_is_the_stop_not_a_fault():
    from ddpdoctor.findings import Finding, Severity
    from ddpdoctor.monitor.judge.diagnose import reports_the_stop

    def exception(text: str) -> Finding:
        return Finding(id="python.exception", severity=Severity.ERROR, summary=text, fix="")

    stopped = "A process raised torch.multiprocessing.spawn.ProcessExitedException: process 0 "
    assert reports_the_stop(exception(stopped + "terminated with signal SIGTERM at x.py:48"))
    assert not reports_the_stop(exception(stopped + "terminated with signal SIGSEGV at x.py:48"))
    assert not reports_the_stop(exception("A process raised ValueError: bad record"))


def test_a_live_local_launchers_children_that_did_not_join_are_named(monkeypatch):
    from ddpdoctor.monitor.model import launchers

    state = state_with(hello(0, pid=12, ppid=10, argv=SPAWN_PARENT, host="here"))
    monkeypatch.setattr(launchers, "current_argv", lambda pid: tuple(SPAWN_PARENT))
    helper = ("python", "-c", "from multiprocessing.resource_tracker import main;main(3)")
    kids = {10: [(12, ("python",)), (13, ("python",)), (14, helper)]}
    [view] = launcher_views(state.ranks, live=True, children=kids.__getitem__, host="here")
    assert view.not_joined == (13,)  # rank 0 joined; 14 is multiprocessing's helper
    assert view.describe().endswith(
        "started rank 0; 1 more of its processes (pid 13) have not joined a process group"
    )
    # post-mortem, another host, or a launcher pid that now runs something else: unknown
    assert launcher_views(state.ranks, children=kids.__getitem__, host="here")[0].not_joined is None
    [away] = launcher_views(state.ranks, live=True, children=kids.__getitem__, host="elsewhere")
    assert away.not_joined is None
    monkeypatch.setattr(launchers, "current_argv", lambda pid: ("bash",))
    [reused] = launcher_views(state.ranks, live=True, children=kids.__getitem__, host="here")
    assert reused.not_joined is None


def test_the_text_view_names_processes_that_have_not_joined_at_once():
    from dataclasses import replace

    out = io.StringIO()
    view = HeadlessView(Console(file=out, width=200, color_system=None), live=False)
    snap = state_with(hello(0, pid=12, ppid=10, argv=SPAWN_PARENT, world_size=3)).snapshot(2.0)
    waiting = replace(snap, launchers=(replace(snap.launchers[0], not_joined=(13,)),))
    view.update(waiting)
    view.update(waiting)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("launcher:")]
    assert lines == [
        "launcher: python multigpu.py 4 2 (node-a:10) started rank 0; 1 more of its processes "
        "(pid 13) have not joined a process group"
    ]


def test_the_status_line_says_when_no_rank_has_joined_yet():
    from ddpdoctor.monitor.tell.diagnosis_text import status_line

    assert status_line(state_with().snapshot(2.0)).endswith(
        "no rank has joined a process group yet"
    )
    joined = state_with(hello(0, pid=12, ppid=10, argv=SPAWN_PARENT, world_size=1))
    assert "not joined" not in status_line(joined.snapshot(2.0))
