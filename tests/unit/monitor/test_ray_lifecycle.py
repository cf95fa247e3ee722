"""Ray's lifecycle is not a fault: Ray ends a worker without exit handlers once its training
function or actor method has returned (a clean finish), and a worker that vanishes while one of
them runs died (the first death, the others' errors its consequences)."""

from __future__ import annotations

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, new_run, train

RAY = {"actor_class": "RayTrainWorker", "actor_id": "a1", "job_id": "01000000", "node_id": "n1"}


def ray_start(w: Writer) -> None:
    for r in range(2):
        w.ev(r, "hello", local_rank=r, world_size=2, host=w.host, pid=7000 + r,
             ray={**RAY, "busy": False, "calls": []})  # fmt: skip
        w.ev(r, "ray_call", state="busy", call="train_fn")
        w.ev(r, "phase", phase="train")


def ended(run, clock, **kw):
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    return monitor.close(job_ended=True, **kw)


def test_workers_ended_by_ray_after_the_training_function_returned_finished_cleanly(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    ray_start(w)
    train(w, clock, 4)
    for r in range(2):
        w.ev(r, "ray_call", state="idle", call="train_fn", ok=True)
    clock.t += 120  # then Ray ends both workers: no exit event, their records just stop
    snap = ended(run, clock, job_exit=0)
    assert [v.state for v in snap.ranks] == [RankState.DONE, RankState.DONE], snap.findings
    assert snap.verdict is Verdict.HEALTHY
    assert [f for f in snap.findings if f.severity.value in ("warning", "error")] == []
    assert [v.state for v in snap.ranks] == [RankState.DONE, RankState.DONE]
    assert [v.actor for v in snap.ranks] == ["RayTrainWorker", "RayTrainWorker"]
    assert snap.ranks[0].to_json()["actor"] == "RayTrainWorker"


def test_a_worker_that_vanished_inside_its_training_function_is_the_first_death(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    ray_start(w)
    train(w, clock, 5)
    clock.t += 1  # rank 1 is killed here; rank 0 fails in its next all-reduce a moment later
    w.ev(0, "collective_start", op="all_reduce", seq=6, group="default", shapes=[[10]],
         dtypes=["float32"])  # fmt: skip
    clock.t += 2
    w.ev(0, "error", exc_type="RuntimeError", message="Connection closed by peer",
         traceback="...", thread="TrainingThread(train_fn)", fatal=True)  # fmt: skip
    w.ev(0, "ray_call", state="idle", call="train_fn", ok=False)
    clock.t += 120
    snap = ended(run, clock, job_exit=1)
    assert snap.verdict is Verdict.CRASH
    assert set(snap.culprits) == {1}
    died = next(f for f in snap.findings if f.id == "died")
    assert "Ray worker process vanished while running its training function" in died.summary
    assert snap.ranks[1].step == 5
