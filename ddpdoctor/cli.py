"""The command line: parses and dispatches, nothing else.

Each command lives in ddpdoctor/commands/<name>.py as `main(args) -> int` and is imported only when
chosen, so `ddpdoctor --version` or `ddpdoctor doctor` never pays for torch or textual.

Errors end in one line on stderr, `ddpdoctor: error: ...`, with the documented exit code
(ddpdoctor.exit_codes); `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from ddpdoctor._version import __version__
from ddpdoctor.console import error_line, safe_stream
from ddpdoctor.errors import DdpdoctorError, UsageError
from ddpdoctor.exit_codes import ExitCode

BACKEND_CHOICES = ("auto", "gloo", "nccl")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _number(parse: type, minimum: float, *, inclusive: bool = True):
    """An argparse `type=` that reads an int or a finite float of at least (or above) `minimum`,
    with one message style for every numeric flag."""
    noun = "an integer" if parse is int else "a number"
    bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"

    def convert(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < minimum or (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    return convert


_positive_int = _number(int, 1)
_non_negative_int = _number(int, 0)
_positive_float = _number(float, 0, inclusive=False)


def _port(text: str) -> int:
    # Deliberately lenient for `doctor`: a bad port is reported by the port check with its fix.
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None


def _tcp_port(text: str) -> int:
    """For `run`: a port torchrun can use, 1..65535 (torchrun would fail with a traceback)."""
    port = _port(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _directory(text: str) -> str:
    """A directory path; '' would silently mean the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not a directory")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ddpdoctor",
        description="Find out why a PyTorch DDP job will not start, hangs, crashes or crawls.",
    )
    parser.add_argument("--version", action="version", version=f"ddpdoctor {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks for errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_doctor(sub)
    _add_run(sub)
    _add_watch(sub)
    _add_explain(sub)
    _add_report(sub)
    return parser


def _add_doctor(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="preflight: check this machine for everything DDP needs",
        description="Check env vars, GPUs, NCCL, ports, rendezvous, shared memory and run a "
        "real collective smoke test. Exit 0 when ready (warnings allowed), 1 on problems.",
    )
    p.add_argument(
        "check_ids", nargs="*", metavar="CHECK_ID", help="run only these checks or groups"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="show every check's details")
    p.add_argument("--strict", action="store_true", help="warnings count as failures")
    p.add_argument("--list-checks", action="store_true", help="list the checks and exit")
    p.add_argument("--nproc", type=_positive_int, help="ranks planned on this host")
    p.add_argument("--nnodes", type=_positive_int, help="nodes the job will span")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--init-method", metavar="URL", help="env://, tcp://HOST:PORT or file:///PATH")
    p.add_argument("--master-addr", metavar="ADDR")
    p.add_argument("--master-port", type=_port, metavar="PORT")
    p.add_argument("--workers", type=_non_negative_int, help="DataLoader workers per rank")
    p.add_argument("--no-smoke", action="store_true", help="skip the collective smoke test")
    p.add_argument(
        "--distributed",
        action="store_true",
        help="started by a launcher on every node: gather all ranks' reports into one (rank 0)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="with --distributed: the report comes within SECONDS (+5), whatever the network "
        "does: joining, probing and forming the process group all share it (default 60)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="with --distributed: run it on every node of a Ray cluster, one task per node "
        "(ADDRESS as ray.init takes it; default: RAY_ADDRESS or the cluster on this machine)",
    )
    p.add_argument("--junit-xml", metavar="FILE", help="also write the report as JUnit XML")
    p.add_argument(
        "--script",
        action="append",
        metavar="FILE",
        help="also check this training script's source for DDP pitfalls (repeatable)",
    )


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run",
        help="launch the reference DDP job, or your script, under torchrun and watch it",
        description="Launch an instrumented DDP job under torchrun and watch every rank. "
        "Without a script, runs the reference job; `ddpdoctor run [OPTIONS] -- train.py ARGS` "
        "runs your script unchanged under ddpdoctor's torchrun; `-- COMMAND ARGS` (python, "
        "torchrun, srun, mpirun, ...) runs your own launch command as given and watches the "
        "ranks it starts.",
    )
    p.add_argument("--nproc", type=_positive_int, help="ranks on this node (default: GPUs, else 2)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--steps", type=_positive_int, help="training steps of the reference job")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault for the reference job: KIND:rank=R[,step=S][,seconds=X] with KIND in "
        "hang, crash, exit, slow, mismatch, shape (repeatable)",
    )
    p.add_argument(
        "--run-dir", type=_directory, metavar="DIR", help="default ./ddpdoctor-runs/<timestamp>"
    )
    p.add_argument("--no-tui", action="store_true", help="plain text even on a terminal")
    p.add_argument(
        "--hang-after",
        type=_positive_float,
        metavar="SECONDS",
        help="flag a hang after this long without progress (default adapts to the job)",
    )
    p.add_argument("--no-doctor", action="store_true", help="skip the preflight doctor")
    p.add_argument(
        "--ddp-buckets",
        action="store_true",
        help="record every DDP gradient bucket as events with a Python comm hook (costs "
        "~80 µs a step) instead of reading PyTorch's flight recorder when needed",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="on a hang, report it but leave the job running",
    )
    p.add_argument(
        "--stop-on-divergence",
        action="store_true",
        help="stop the job when the replicas of a DDP model stop being identical (by default "
        "the divergence is reported and the job runs on: it does not hang)",
    )
    p.add_argument("--model", choices=("cnn", "resnet18"), help="reference job model")
    p.add_argument("--data", metavar="DIR", help="CIFAR-10 folder for the reference job")
    p.add_argument("--batch-size", type=_positive_int, help="reference job batch size per rank")
    p.add_argument("--workers", type=_non_negative_int, help="DataLoader workers per rank")
    p.add_argument("--json", action="store_true", help="print the final diagnosis as JSON")
    p.add_argument(
        "--no-slurm-env",
        action="store_true",
        help="under srun, leave RANK, WORLD_SIZE, MASTER_* unset instead of filling them from "
        "Slurm's variables",
    )
    multi = p.add_argument_group("multi-node (passed to torchrun)")
    multi.add_argument("--nnodes", metavar="N[:M]")
    multi.add_argument("--node-rank", type=_non_negative_int)
    multi.add_argument("--rdzv-backend")
    multi.add_argument("--rdzv-endpoint", metavar="HOST:PORT")
    multi.add_argument("--rdzv-id")
    multi.add_argument("--master-addr", metavar="ADDR")
    multi.add_argument("--master-port", type=_tcp_port, metavar="PORT")
    multi.add_argument(
        "--join-timeout",
        type=_positive_int,
        metavar="SECONDS",
        help="how long to wait for every node to join (torchrun's default: 600)",
    )
    p.set_defaults(script=None, script_args=[])


def _add_watch(sub) -> None:
    p = sub.add_parser(
        "watch",
        help="watch a run directory (live or finished) and diagnose it",
        description="Attach to a run directory. Quitting leaves the job alone.",
    )
    p.add_argument("run_dir", type=_directory, metavar="RUN_DIR")
    p.add_argument("--no-tui", action="store_true", help="plain text even on a terminal")
    p.add_argument("--json", action="store_true", help="print the snapshot and diagnosis once")
    p.add_argument("--hang-after", type=_positive_float, metavar="SECONDS")


def _add_explain(sub) -> None:
    p = sub.add_parser(
        "explain",
        help="read NCCL / torch / torchrun / gloo logs and flight-recorder dumps: what went wrong",
        description="Explain log files, flight-recorder dumps or run directories. Exit 1 when "
        "an error is found.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="logs, dumps or directories")
    p.add_argument("--json", action="store_true", help="print findings as JSON")


def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report (and a trace) of a run directory",
        description="Write RUN_DIR/report.html: verdict, findings, timeline, step times, stacks.",
    )
    p.add_argument("run_dir", type=_directory, metavar="RUN_DIR")
    p.add_argument("-o", "--output", metavar="FILE", help="the HTML file (RUN_DIR/report.html)")
    p.add_argument("--trace", metavar="FILE", help="also write Chrome/Perfetto trace JSON")


def split_script(argv: list[str]) -> tuple[list[str], list[str]]:
    """`ddpdoctor run [OPTIONS] -- SCRIPT ARGS`: everything after the first `--` is the user's."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    own, script = split_script(list(argv))
    args = build_parser().parse_args(own)
    if args.command is None:
        raise UsageError("no command given: use doctor, run, watch, explain or report (see --help)")
    if script:
        if args.command != "run":
            raise UsageError(f"'--' and a script only go with 'run', not '{args.command}'")
        args.script, args.script_args = script[0], script[1:]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # ddpdoctor's own output must never end it (nor the job it runs): a reader that went away or
    # a full disk ends the printing quietly (console.SafeStream), here for every print and dump.
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = safe_stream(sys.stdout), safe_stream(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = parse_args(argv)
        command = importlib.import_module(f"ddpdoctor.commands.{args.command}")
        return int(command.main(args))
    except DdpdoctorError as exc:
        if debug:
            traceback.print_exc()
        print(error_line(str(exc)), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print(error_line("interrupted"), file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except SystemExit as exc:  # --help and --version exit 0 through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:
        return int(ExitCode.OK)  # `ddpdoctor ... | head` closed the pipe: not an error
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 3
        if debug:
            traceback.print_exc()
        print(
            error_line(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)"),
            file=sys.stderr,
        )
        return int(ExitCode.INTERNAL)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
