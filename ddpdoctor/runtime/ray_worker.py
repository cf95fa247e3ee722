"""The runtime in a Ray worker: who the rank is to Ray, and whether the user's code is running.

Ray's workers run the user's code in calls: an actor's methods (the RL stacks create actors that
join a process group in one method and train in another) and Ray Train's training function,
which runs in a thread of its own ("TrainingThread(...)") while the worker's main thread serves
Ray's calls. When that code has returned, Ray ends the worker without Python's exit handlers (at
the end of the training function, at the driver's exit): no exit event is written, and that is
not a crash. So the runtime says when the user's code starts and returns (`ray_call` events,
written at once): a rank that vanishes while none of its calls runs was ended by Ray after its
work was done; one that vanishes inside a call died.

The hooks are installed by autostart.py in every Ray worker process (`default_worker.py`),
before Ray's modules are imported: each actor method of the user's classes (not Ray's own) and
Ray Train's thread runner are wrapped. An exception that a call raises is recorded as the rank's
error (Ray returns it to the caller; the process lives on, so no exception hook sees it).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.events import ERROR, RAY_CALL
from ddpdoctor.runtime import ray_identity
from ddpdoctor.runtime.ray_identity import busy, is_ray_worker

__all__ = ["busy", "install", "is_ray_worker", "tracked"]
from ddpdoctor.runtime.import_hooks import when_imported

ACTOR_MODULE = "ray._private.function_manager"
TRAIN_RUNNER_MODULE = "ray.train.v2._internal.execution.worker_group.thread_runner"
TRAIN_FN = "train_fn"  # the call's name for Ray Train's training function
TRAIN_MODULE = "ray.train"
# ray.train.report is a barrier of the training function's workers: a collective to ddpdoctor,
# in a group of its own (Ray's, not a torch process group), so a rank that waits in it for a
# stalled one shows as waiting, and the stalled one as behind.
REPORT_OP = "ray.train.report"
REPORT_GROUP = "ray.train"
WRAPPED = "__ddpdoctor_ray__"


def install() -> None:
    """Wrap the user's calls in this Ray worker (once Ray's modules are imported)."""
    when_imported(ACTOR_MODULE, _wrap_actor_methods)
    when_imported(TRAIN_RUNNER_MODULE, _wrap_thread_runner)
    when_imported(TRAIN_MODULE, _wrap_report)


# -- the user's calls -------------------------------------------------------------------------


def _enter(name: str) -> int:
    call, first = ray_identity.enter(name)
    if first:
        # Ray Train's restart budget, read once the training function runs (its context is set)
        budget = ray_identity.train_max_failures() if name == TRAIN_FN else None
        _say("busy", name, **({"max_failures": budget} if budget is not None else {}))
    return call


def _leave(call: int, *, ok: bool) -> None:
    name, idle = ray_identity.leave(call)
    if not idle:
        return
    runtime = _active()
    if runtime is not None and ok:
        # the step still open when the user's code returned is a finished step: Ray ends the
        # worker without exit handlers, which would otherwise never close it
        try:
            runtime.steps.flush()
        except Exception:  # noqa: BLE001
            pass
    _say("idle", name, ok=ok)


def _active() -> Any:
    """The rank's runtime, once it has joined (imported late: every process of a job imports
    this module at startup, and most never become a rank)."""
    from ddpdoctor.runtime import core

    return core.active()


def _say(state: str, name: str, **extra: Any) -> None:
    runtime = _active()
    if runtime is not None:
        runtime.emit(RAY_CALL, state=state, call=name, **extra)


def _record_error(exc: BaseException) -> None:
    runtime = _active()
    if runtime is None:
        return
    from ddpdoctor.runtime.exit_hooks import error_fields

    try:
        runtime.emit(
            ERROR,
            **error_fields(
                type(exc),
                exc,
                exc.__traceback__,
                thread=threading.current_thread().name,
                fatal=True,  # the user's call ended with it (Ray passes it on to the caller)
            ),
        )
    except Exception:  # noqa: BLE001
        pass


def tracked(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, saying when it starts and returns, and recording the exception it raises."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = _enter(name)
        ok = False
        try:
            result = function(*args, **kwargs)
            ok = True
            return result
        except BaseException as exc:
            _record_error(exc)
            raise
        finally:
            _leave(token, ok=ok)

    setattr(call, WRAPPED, True)
    return call


def _is_users(method: Any) -> bool:
    module = getattr(method, "__module__", None) or ""
    return not (module == "ray" or module.startswith(("ray.", "ddpdoctor.")))


def _wrap_actor_methods(function_manager: Any) -> None:
    """Each actor method of the user's classes runs tracked (not Ray's own actors' methods, not
    coroutines: an async actor's call returns at its first await)."""
    manager: Any = getattr(function_manager, "FunctionActorManager", None)
    original = getattr(manager, "_make_actor_method_executor", None)
    if manager is None or original is None or getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def make_executor(self: Any, method_name: str, method: Callable[..., Any]) -> Any:
        executor = original(self, method_name, method)
        if (
            method_name.startswith("__ray")
            or not _is_users(method)
            or inspect.iscoroutinefunction(method)
            or inspect.isasyncgenfunction(method)
            or inspect.isgeneratorfunction(method)
        ):
            return executor
        wrapped = tracked(method_name, executor)
        for attr in ("name", "method"):  # what Ray's task executor reads off the executor
            if hasattr(executor, attr):
                setattr(wrapped, attr, getattr(executor, attr))
        return wrapped

    setattr(make_executor, WRAPPED, True)
    manager._make_actor_method_executor = make_executor


def _wrap_thread_runner(thread_runner: Any) -> None:
    """Ray Train's training function runs tracked in its training thread."""
    runner: Any = getattr(thread_runner, "ThreadRunner", None)
    original = getattr(runner, "run", None)
    if runner is None or original is None or getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def run(self: Any, target: Callable[[], Any]) -> Any:
        return original(self, tracked(TRAIN_FN, target))

    setattr(run, WRAPPED, True)
    runner.run = run


def _wrap_report(train: Any) -> None:
    """`ray.train.report` recorded as a collective of the training function's workers."""
    original = getattr(train, "report", None)
    if original is None or getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def report(*args: Any, **kwargs: Any) -> Any:
        runtime = _active()
        rec = None
        if runtime is not None:
            try:
                from ddpdoctor.runtime.collectives import GroupInfo, TensorSummary

                group = GroupInfo(REPORT_GROUP, runtime.world_size)
                rec = runtime.collectives.start(REPORT_OP, group, TensorSummary(), is_async=False)
            except Exception:  # noqa: BLE001 - the report goes on, unrecorded
                rec = None
        ok = False
        try:
            result = original(*args, **kwargs)
            ok = True
            return result
        finally:
            if rec is not None:
                try:
                    runtime.collectives.end(rec, ok=ok)
                except Exception:  # noqa: BLE001
                    pass

    setattr(report, WRAPPED, True)
    train.report = report
