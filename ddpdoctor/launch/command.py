"""What follows `ddpdoctor run --`: a script ddpdoctor starts under its own torchrun, or a program
the user's own launch pattern starts, which ddpdoctor runs as given.

    -- train.py ARGS              script: ddpdoctor's torchrun runs it through the bootstrap
    -- -m pkg.train ARGS          module: the same
    -- python train.py ARGS       program: run as given (an mp.spawn script starts its own ranks)
    -- torchrun ... train.py      program: the user's torchrun, not nested in ddpdoctor's
    -- srun / mpirun / accelerate launch / deepspeed / anything else on PATH

A word ending in .py is always a script; otherwise an executable file or a program on PATH is a
program; anything else is a usage error.
"""

from __future__ import annotations

import ast
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.errors import UsageError
from ddpdoctor.protocol import bounded

SCRIPT = "script"
COMMAND = "command"

# How a program's launch pattern is named in run.json and on screen (by its basename).
_KINDS = {
    "torchrun": "torchrun",
    "srun": "srun",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "accelerate": "accelerate",
    "deepspeed": "deepspeed",
}
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class UserCommand:
    """The words after `--`, classified."""

    mode: str  # SCRIPT or COMMAND
    argv: tuple[str, ...]
    kind: str  # "script", "module", "python", "torchrun", "srun", "mpirun", ..., "program"

    @property
    def is_command(self) -> bool:
        return self.mode == COMMAND

    @property
    def python_script(self) -> str | None:
        """The .py file a program runs (`python train.py`, `torchrun ... train.py`), if any: what
        the preflight's source checkup reads."""
        for word in self.argv[1:]:
            if word.endswith(".py") and os.path.isfile(word):
                return word
        return None


def classify(argv: Sequence[str], *, path: str | None = None) -> UserCommand:
    """Classify the words after `--` (argv non-empty); UsageError for a program not found."""
    words = tuple(argv)
    first = words[0]
    if first == "-m":
        return UserCommand(SCRIPT, words, "module")
    if first.endswith(".py"):
        return UserCommand(SCRIPT, words, "script")
    if os.sep in first:
        if not (os.path.isfile(first) and os.access(first, os.X_OK)):
            raise UsageError(f"command not found: {first} (no such executable file)")
    elif shutil.which(first, path=path) is None:
        if os.path.isfile(first):
            return UserCommand(SCRIPT, words, "script")  # a script without .py, in the cwd
        raise UsageError(
            f"command not found: {first} (give a training script, -m MODULE, or a program on PATH)"
        )
    return UserCommand(COMMAND, words, program_kind(words))


def program_kind(words: Sequence[str]) -> str:
    """torchrun, srun, mpirun, accelerate, deepspeed, python, or program."""
    name = os.path.basename(words[0])
    if name in _KINDS:
        return _KINDS[name]
    if name.startswith("python"):
        rest = list(words[1:])
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _TORCHRUN_MODULES:
            return "torchrun"
        return "python"
    return "program"


_SPAWNERS = frozenset({"spawn", "start_processes"})
_MP_NAMES = frozenset({"mp", "multiprocessing", "torch_mp", "tmp"})


def starts_own_ranks(path: str) -> bool:
    """The script calls torch.multiprocessing's spawn / start_processes: it starts its ranks
    itself, so under ddpdoctor's torchrun it would be one process starting a world of its own."""
    try:  # a regular file only, bounded (a FIFO named as the script would block the launch)
        tree = ast.parse(bounded.read_bytes(path, 16 << 20, follow=True))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in _SPAWNERS:
            continue
        owner = node.func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if name in _MP_NAMES:
            return True
    return False


def spawn_hint(script: str) -> str:
    """The warning for a script that starts its own ranks, given as a script."""
    return (
        f"{script} starts its own ranks (mp.spawn): under ddpdoctor's torchrun it would run as one "
        f"rank that starts a world of its own; run it as `ddpdoctor run -- python {script} ...` "
        "and ddpdoctor watches the ranks it spawns"
    )
