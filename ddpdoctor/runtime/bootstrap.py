"""Run a user's training script, unchanged, with the runtime active.

    torchrun --nproc-per-node 2 -m ddpdoctor.runtime.bootstrap train.py --lr 0.1
    torchrun --nproc-per-node 2 -m ddpdoctor.runtime.bootstrap -m pkg.train --lr 0.1

The script runs exactly as `python train.py --lr 0.1` (or `python -m pkg.train ...`) would run it:
`__name__ == "__main__"` in a fresh `__main__` module that stays in sys.modules (so pickling and
multiprocessing spawn find it), `sys.argv == ["train.py", "--lr", "0.1"]`, the script's folder
first on sys.path, an absolute `__file__`; `sys.exit(3)` exits with 3 and an exception exits 1
with the usual traceback (ddpdoctor's own frames trimmed). A script that does not exist is one
error line and exit 2.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
import zipfile
from dataclasses import dataclass
from typing import Any

from ddpdoctor.console import error_line
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol.rundir import ENV_RUN_DIR
from ddpdoctor.runtime import activation, autostart
from ddpdoctor.runtime.exit_hooks import exit_code_of
from ddpdoctor.runtime.info import env_int

USAGE = "usage: python -m ddpdoctor.runtime.bootstrap SCRIPT [ARGS...] | -m MODULE [ARGS...]"


@dataclass(frozen=True)
class Target:
    """What to run: a script path, or a module name (-m), with its arguments."""

    argv0: str  # sys.argv[0] as the program will see it
    args: tuple[str, ...]
    path: str | None = None  # absolute path of the script (or its directory / zip archive)
    module: str | None = None
    spec: Any = None  # the module's ModuleSpec (-m)

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.path)


def resolve(argv: list[str]) -> Target:
    """Read the bootstrap's command line; every mistake is a UsageError."""
    if not argv or argv[0] in ("-h", "--help"):
        raise UsageError(USAGE)
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1]:
            raise UsageError(f"-m needs a module name ({USAGE})")
        return _resolve_module(argv[1], tuple(argv[2:]))
    script = argv[0]
    # as python makes __file__ absolute: joined to the cwd, not normalised ("cwd/../x.py")
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    if not os.path.exists(path):
        raise UsageError(f"cannot run script {script!r}: no such file")
    if not os.path.isdir(path) and not os.access(path, os.R_OK):
        raise UsageError(f"cannot run script {script!r}: permission denied")
    return Target(argv0=script, args=tuple(argv[1:]), path=path)


def _resolve_module(name: str, args: tuple[str, ...]) -> Target:
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            main_name = f"{name}.__main__"  # a package runs its __main__, as python -m does
            spec = importlib.util.find_spec(main_name)
            if spec is None:
                raise UsageError(
                    f"cannot run module {name!r}: it is a package without a __main__ module"
                )
    except ImportError as exc:
        raise UsageError(f"cannot run module {name!r}: {exc}") from None
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot run module {name!r}: no module named {name!r}")
    origin = spec.origin if spec.has_location else name
    return Target(argv0=str(origin), args=args, module=name, spec=spec)


def fresh_main_module(target: Target) -> types.ModuleType:
    """A new `__main__` module, as the interpreter makes one for a script or for -m."""
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    if target.spec is not None:
        spec = target.spec
        module.__spec__ = spec
        module.__loader__ = spec.loader
        module.__package__ = spec.parent
        module.__file__ = spec.origin if spec.has_location else None
        module.__cached__ = spec.cached  # type: ignore[attr-defined]
    else:
        module.__spec__ = None
        module.__loader__ = importlib.machinery.SourceFileLoader("__main__", str(target.path))
        module.__package__ = None
        module.__file__ = target.path
        module.__cached__ = None  # type: ignore[attr-defined]
    sys.modules["__main__"] = module
    return module


def _code_of(target: Target) -> Any:
    if target.spec is not None:
        return target.spec.loader.get_code(target.spec.name)
    with open(str(target.path), "rb") as fh:  # bytes: compile honours a coding cookie
        source = fh.read()
    return compile(source, str(target.path), "exec", dont_inherit=True)


def _runs_as_archive(path: str) -> bool:
    return os.path.isdir(path) or zipfile.is_zipfile(path)


def execute(target: Target) -> None:
    """Run the target in this process (exceptions propagate, trimmed by main)."""
    if target.path is not None and _runs_as_archive(target.path):
        runpy.run_path(target.path, run_name="__main__")  # a folder or zip with __main__.py
        return
    module = fresh_main_module(target)
    exec(_code_of(target), module.__dict__)


def _trimmed(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop this module's frames from the top of a traceback: the user sees their own."""
    own = globals()
    while tb is not None and tb.tb_frame.f_globals is own:
        tb = tb.tb_next
    return tb


def _start(target: Target) -> Any:
    """The runtime for this process. Under torchrun ($RANK set) it records at once as that rank.
    Without $RANK the script may start its ranks itself (mp.spawn): this process becomes a rank
    only if it joins a process group, and its children run ddpdoctor's sitecustomize, so each of
    them becomes one when it joins (ddpdoctor/runtime/autostart.py)."""
    if env_int("RANK") is not None or not os.environ.get(ENV_RUN_DIR):
        return activation.start(script=target.label)
    os.environ["PYTHONPATH"] = autostart.with_site_dir(os.environ.get("PYTHONPATH"))
    autostart.when_imported(autostart.WATCHED_MODULE, autostart.wrap_init_process_group)
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        target = resolve(args)
    except UsageError as exc:
        sys.stderr.write(error_line(str(exc)) + "\n")
        return int(ExitCode.USAGE)
    sys.argv = [target.argv0, *target.args]
    if target.path is not None and not os.path.isdir(target.path):
        # python puts the script's (real) folder first on sys.path, in place of the cwd
        sys.path[0] = os.path.dirname(os.path.realpath(target.path))
    runtime = _start(target)
    try:
        execute(target)
    except SystemExit as exc:
        if runtime is not None:
            runtime.hint_exit(exit_code_of(exc.code), "sys.exit")
        raise
    except KeyboardInterrupt as exc:
        exc.with_traceback(_trimmed(exc.__traceback__))
        raise  # python reports it and dies of SIGINT, as it would have
    except BaseException as exc:  # noqa: BLE001 - reported as python would, then exit 1
        # the printer prefers the exception's own __traceback__ to the one passed: trim both
        exc.with_traceback(_trimmed(exc.__traceback__))
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if runtime is not None:
            runtime.hint_exit(1, "exception")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
