"""Exceptions and exits: `error` events with the traceback, one `exit` event at the very end.

- `sys.excepthook` and `threading.excepthook` write an `error` event and then call the hook that
  was there before, so what the user sees on stderr does not change.
- faulthandler prints the stacks of every thread on a fatal signal (SIGSEGV, SIGABRT, ...) to the
  rank's stderr, which torchrun keeps in the rank's log; after a clean exit it is off again
  (torch's teardown is the job's own).
- At interpreter exit (atexit) the `exit` event carries the code: from `sys.exit(...)`, from an
  uncaught exception (1), or 0. A process ended by os._exit or SIGKILL writes no exit event, and
  that absence is how a watcher knows the rank died.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import sys
import sysconfig
import threading
import traceback
from types import TracebackType
from typing import Any, NoReturn

from ddpdoctor.protocol.events import ERROR
from ddpdoctor.runtime import core

MAX_TRACEBACK_CHARS = 32_000
MAX_MESSAGE_CHARS = 4_000

# Frames under these are not "the user's line": the stdlib, installed packages, these hooks.
_LIBRARY_DIRS = tuple(
    p
    for p in (
        sysconfig.get_paths().get("stdlib"),
        sysconfig.get_paths().get("purelib"),
        sysconfig.get_paths().get("platlib"),
        os.path.dirname(os.path.abspath(__file__)),
    )
    if p
)


def exit_code_of(status: Any) -> int:
    """The process exit code that `sys.exit(status)` leads to."""
    if status is None:
        return 0
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    return 1


def type_name(exc_type: type[BaseException]) -> str:
    module = getattr(exc_type, "__module__", "builtins")
    name = getattr(exc_type, "__qualname__", exc_type.__name__)
    return name if module in ("builtins", "__main__", None) else f"{module}.{name}"


def error_fields(
    exc_type: type[BaseException],
    exc: BaseException | None,
    tb: TracebackType | None,
    *,
    thread: str | None,
    fatal: bool,
) -> dict[str, Any]:
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    if len(text) > MAX_TRACEBACK_CHARS:  # keep the end: the innermost frames and the message
        text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
    return {
        "exc_type": type_name(exc_type),
        "message": str(exc)[:MAX_MESSAGE_CHARS] if exc is not None else "",
        "traceback": text,
        "thread": thread,
        "fatal": fatal,
        "location": user_location(tb),
    }


def user_location(tb: TracebackType | None) -> dict[str, Any] | None:
    """The innermost frame in the user's code (not the stdlib, site-packages or these hooks)."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    if not frames:
        return None
    chosen = frames[-1]
    for frame in reversed(frames):
        name = frame.filename
        if not name.startswith("<") and not name.startswith(_LIBRARY_DIRS):
            chosen = frame
            break
    return {"file": chosen.filename, "line": chosen.lineno, "function": chosen.name}


def report_exception(
    exc_type: type[BaseException],
    exc: BaseException | None,
    tb: TracebackType | None,
    *,
    fatal: bool,
) -> None:
    """Write the error event for an exception that ends the process (or a thread)."""
    runtime = core.active()
    if runtime is None:
        return
    try:
        runtime.emit(
            ERROR,
            **error_fields(exc_type, exc, tb, thread=threading.current_thread().name, fatal=fatal),
        )
        if fatal:
            if issubclass(exc_type, KeyboardInterrupt):
                runtime.hint_exit(-2, "signal", "SIGINT")  # Python dies of SIGINT then
            else:
                runtime.hint_exit(1, "exception")
    except Exception:  # noqa: BLE001
        pass


def install(runtime: core.Runtime) -> None:
    _install_excepthooks(runtime)
    _install_faulthandler(runtime)
    _install_exit(runtime)


def _install_excepthooks(runtime: core.Runtime) -> None:
    previous = sys.excepthook

    def ddpdoctor_excepthook(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        report_exception(exc_type, exc, tb, fatal=True)
        previous(exc_type, exc, tb)

    sys.excepthook = ddpdoctor_excepthook

    previous_thread = threading.excepthook

    def ddpdoctor_thread_excepthook(args: Any) -> None:
        if args.exc_type is not SystemExit:  # threading ignores SystemExit silently
            runtime_now = core.active()
            if runtime_now is not None:
                try:
                    name = args.thread.name if args.thread is not None else None
                    runtime_now.emit(
                        ERROR,
                        **error_fields(
                            args.exc_type,
                            args.exc_value,
                            args.exc_traceback,
                            thread=name,
                            fatal=False,
                        ),
                    )
                except Exception:  # noqa: BLE001
                    pass
        previous_thread(args)

    threading.excepthook = ddpdoctor_thread_excepthook

    def undo() -> None:
        if sys.excepthook is ddpdoctor_excepthook:
            sys.excepthook = previous
        if threading.excepthook is ddpdoctor_thread_excepthook:
            threading.excepthook = previous_thread

    runtime.on_deactivate(undo)


def _install_faulthandler(runtime: core.Runtime) -> None:
    if faulthandler.is_enabled():
        return  # the user's own, left as it is (also at exit)
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            faulthandler.enable(file=stream, all_threads=True)
        except Exception:  # noqa: BLE001 - a stream without a file descriptor (captured stderr)
            continue
        runtime.on_deactivate(faulthandler.disable)
        runtime.faulthandler_ours = True
        return


def step_aside_at_clean_exit(runtime: core.Runtime) -> None:
    """Once a clean exit is recorded, the faulthandler ddpdoctor enabled is turned off again:
    torch's C++ teardown now and then aborts a finished process ("At exit" in
    docs/frameworks.md), and faulthandler, dumping every thread in the middle of that teardown,
    can itself fault, so that torchrun reported SIGSEGV where the job without ddpdoctor dies of
    SIGABRT. The rest of the exit is the job's own, as it would be without ddpdoctor."""
    hint = runtime.exit_hint
    if not runtime.faulthandler_ours or (
        hint is not None and not core.ends_cleanly(hint.code, hint.reason)
    ):
        return
    try:
        faulthandler.disable()
    except Exception:  # noqa: BLE001 - at exit: the job's own teardown goes on as it would
        pass


def release_gloo_group(runtime: core.Runtime) -> None:
    """At a clean exit, destroy a gloo process group the script left standing.

    Lightning and the HF Trainer never destroy the group, and torch's teardown of a gloo group
    at interpreter exit can abort a process that finished ("terminate called without an active
    exception", SIGABRT). Destroying it first is what a script should do; it does not remove that
    abort, which comes from torch's teardown with or without ddpdoctor (docs/frameworks.md, "At
    exit", has the figures), but it leaves nothing of ddpdoctor's making. Only after a clean exit
    and only for gloo, whose destroy is local: an exception or a signal may leave collectives
    pending, and NCCL's teardown can wait on them."""
    hint = runtime.exit_hint
    if hint is not None and not core.ends_cleanly(hint.code, hint.reason):
        return
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        if dist.get_backend() != "gloo":
            return
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - at exit: the job's own teardown goes on as it would
        pass


def _install_exit(runtime: core.Runtime) -> None:
    # atexit runs the last registered first: once the exit event is out, faulthandler steps
    # aside, then the group is released
    release = functools.partial(release_gloo_group, runtime)
    step_aside = functools.partial(step_aside_at_clean_exit, runtime)
    atexit.register(release)
    atexit.register(step_aside)
    atexit.register(runtime.write_exit_event)
    runtime.on_deactivate(lambda: atexit.unregister(runtime.write_exit_event))
    runtime.on_deactivate(lambda: atexit.unregister(step_aside))
    runtime.on_deactivate(lambda: atexit.unregister(release))

    original_exit = sys.exit

    def exit(status: Any = None) -> NoReturn:
        current = core.active()
        if current is not None:
            current.hint_exit(exit_code_of(status), "sys.exit")
        original_exit(status)

    exit.__doc__ = original_exit.__doc__
    sys.exit = exit

    def undo() -> None:
        if sys.exit is exit:
            sys.exit = original_exit

    runtime.on_deactivate(undo)
