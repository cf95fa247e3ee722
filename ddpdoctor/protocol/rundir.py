"""The run directory: the one protocol between the ranks of a job and everything that watches it.

A live job, a post-mortem, a copy mailed in a bug report and many nodes on a shared filesystem all
look the same to a watcher, because everything it knows comes from here:

    RUN_DIR/
      run.json                 what was launched (written by the launcher)
      events/rank-<R>.jsonl    one append-only JSON object per line, per rank (runtime/)
      logs/<host>/...          per-rank stdout/stderr captured by torchrun --log-dir on that host
                               (logs/<host>/node-<N>/... when the job spans nodes: two agents may
                               share a host, so each node's launcher has its own folder)
      nodes/node-<N>/          one folder per node's launcher: node.json (host, pids, how its
                               torchrun ended) and that node's doctor.json
      nccl/                    NCCL_DEBUG_FILE=RUN_DIR/nccl/%h.%p.log
      stacks/<capture>/        py-spy dumps, one JSON file per rank: rank-<R>.json
      requests/                stack-capture requests for launchers on other nodes (<id>.json) and
                               their answers (<id>.node<N>.done), see ddpdoctor/protocol/stack_requests.py
      doctor.json              the preflight report, when run
      diagnosis.json           the monitor's latest verdict
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.errors import UsageError
from ddpdoctor.protocol import jsontext

# Set by the launcher in every rank's environment; the in-rank runtime writes where it points.
ENV_RUN_DIR = "DDPDOCTOR_RUN_DIR"
DEFAULT_PARENT = "ddpdoctor-runs"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def nccl_dir(self) -> Path:
        return self.path / "nccl"

    @property
    def stacks_dir(self) -> Path:
        return self.path / "stacks"

    @property
    def requests_dir(self) -> Path:
        return self.path / "requests"

    @property
    def nodes_dir(self) -> Path:
        return self.path / "nodes"

    @property
    def doctor_json(self) -> Path:
        return self.path / "doctor.json"

    def node_dir(self, node_rank: int) -> Path:
        """The folder of one node's launcher in a job that spans nodes."""
        return self.nodes_dir / f"node-{node_rank}"

    def node_json(self, node_rank: int) -> Path:
        return self.node_dir(node_rank) / "node.json"

    def doctor_json_for(self, node_rank: int | None) -> Path:
        """doctor.json of a one-node run, or of node N's preflight when the job spans nodes."""
        return self.doctor_json if node_rank is None else self.node_dir(node_rank) / "doctor.json"

    @property
    def diagnosis_json(self) -> Path:
        return self.path / "diagnosis.json"

    @property
    def stopped_json(self) -> Path:
        """The launcher's stop, written when it stops the job for a verdict (monitor.judge.held)."""
        return self.path / "stopped.json"

    def events_file(self, rank: int) -> Path:
        return self.events_dir / f"rank-{rank}.jsonl"

    def host_logs_dir(self, host: str | None = None) -> Path:
        """torchrun's --log-dir for the agent on `host` (one per node, so nodes never collide)."""
        return self.logs_dir / (host or socket.gethostname())

    def node_logs_dir(self, node_rank: int | None, host: str | None = None) -> Path:
        """torchrun's --log-dir for this launcher: logs/<host>/ on one node, logs/<host>/node-<N>/
        when the job spans nodes (two agents on one host must not share a folder)."""
        base = self.host_logs_dir(host)
        return base if node_rank is None else base / f"node-{node_rank}"

    def nccl_debug_file_pattern(self) -> str:
        """NCCL expands %h (host) and %p (pid) itself."""
        return str(self.nccl_dir / "%h.%p.log")

    @classmethod
    def create(cls, path: str | os.PathLike[str] | None = None) -> RunDir:
        """Make a run directory and its subfolders; a path that cannot be made is a usage error.

        Without a path, a new time-named directory is claimed under ./ddpdoctor-runs. Several
        launchers may create the same explicit path at once (nodes on a shared file system).

        Run directories are private (0700: the hello events hold the script's command line, the
        logs whatever the job prints) and made safely: a directory owned by another user, or a
        subfolder that is a symlink or not a folder, is refused instead of written into.
        """
        target = Path(path) if path is not None else None
        try:
            if target is None:
                target = claim_default_run_path()
            run = cls(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            make_private_dir(run.path, top=True)
            for sub in (run.events_dir, run.logs_dir, run.nccl_dir, run.stacks_dir):
                make_private_dir(sub)
            _probe_writable(run.path)
            _probe_writable(run.events_dir)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            where = target if target is not None else Path.cwd() / DEFAULT_PARENT
            raise UsageError(f"cannot create run directory {where}: {reason}") from exc
        return run

    @classmethod
    def check_fresh(cls, path: str | os.PathLike[str], *, node_rank: int | None = None) -> None:
        """Refuse to start a run in a directory that holds another run: its events, logs and
        verdict would mix with the new run's (an old crash listed under a healthy rerun).

        A job that spans nodes shares one directory between its launchers, so there only this
        node's own record (nodes/node-<N>/) makes the directory used."""
        target = Path(path)
        try:
            st = os.stat(target)
        except OSError:
            return  # nothing there to mix with (and create() says why it cannot be made)
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"cannot use run directory {target}: it is not a directory")
        _check_owner(target, st)
        run = cls(target)
        fix = "choose a new --run-dir, or leave --run-dir out for a fresh ./ddpdoctor-runs/<time>"
        if node_rank is not None:
            if os.path.lexists(run.node_dir(node_rank)):
                raise UsageError(
                    f"run directory {target} already holds node {node_rank}'s part of a run "
                    f"(nodes/node-{node_rank}/): {fix}"
                )
            return
        try:
            entries = os.listdir(target)
        except OSError as exc:
            raise UsageError(f"cannot use run directory {target}: {exc.strerror or exc}") from exc
        if entries:
            raise UsageError(
                f"run directory {target} is not empty (it holds an earlier run: "
                f"{', '.join(sorted(entries)[:4])}{', ...' if len(entries) > 4 else ''}): {fix}"
            )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunDir:
        """An existing run directory, for watch / explain / post-mortem."""
        target = Path(path)
        if not target.is_dir():
            raise UsageError(f"not a run directory: {target} (no such directory)")
        if not (target / "events").is_dir() and not (target / "run.json").is_file():
            raise UsageError(f"not a run directory: {target} (no run.json and no events/ inside)")
        return cls(target)

    def read_run_json(self) -> dict[str, Any]:
        """run.json, or {} when it is missing or unreadable (a copied directory may lack it)."""
        try:
            data = jsontext.read(self.run_json)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


class UnsafeRunDir(OSError):
    """A run directory (or a folder in it) that must not be written into."""


def _check_owner(path: Path, st: os.stat_result) -> None:
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UsageError(
            f"cannot use run directory {path}: it is owned by another user (uid {st.st_uid}), "
            "so its files could be read or replaced by them: choose a directory of your own"
        )


def make_private_dir(path: Path, *, top: bool = False) -> None:
    """mkdir 0700, or accept an existing folder of this user's; never a symlink inside a run
    directory (`top`: the run directory itself may be reached through a symlinked parent or
    be one, as with --run-dir /scratch/run; its contents may not)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.stat(path) if top else os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeRunDir(0, f"{path} is {what}: refusing to write through it")
    _check_owner(path, st)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def make_private_dirs(path: Path) -> None:
    """`path` and whichever of its parents are missing, each made 0700 (Path.mkdir(parents=True)
    would make the parents 0777 less the umask: 0755). Folders that exist are left as they are."""
    missing = []
    current = Path(path)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # made by another process meanwhile


def make_private(path: str | os.PathLike[str]) -> None:
    """Take group and other permissions off a file or folder of this user's that has them: for
    what a tool ddpdoctor starts writes into the run directory with its own modes (torchrun's
    per-rank log folders and files). Another user's file, or one gone, is left alone."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_IMODE(st.st_mode) & 0o077:
            return
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            return
        os.chmod(path, 0o700 if stat.S_ISDIR(st.st_mode) else 0o600)
    except OSError:
        return


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """A file descriptor on `path` inside a run directory: created 0600, never through a
    symlink (O_NOFOLLOW), not inherited by children (O_CLOEXEC)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def claim_default_run_path(now: float | None = None) -> Path:
    """Create and return ./ddpdoctor-runs/<YYYYmmdd-HHMMSS>[-N], a name no other run holds.

    The name is claimed by mkdir itself (no exist_ok): runs started in the same second, even in
    other threads or processes, each get their own directory instead of sharing one.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    parent = Path.cwd() / DEFAULT_PARENT
    parent.mkdir(parents=True, exist_ok=True)
    name, n = stamp, 1
    while True:
        candidate = parent / name
        try:
            candidate.mkdir(0o700)
            return candidate
        except FileExistsError:
            n += 1
            name = f"{stamp}-{n}"


def _probe_writable(folder: Path) -> None:
    """Raise OSError unless a file can be created in `folder`.

    The probe file is this caller's own (mkstemp: a random name, O_EXCL): launchers creating the
    same run directory at once must never remove each other's probe.
    """
    fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
    os.close(fd)
    os.unlink(probe)


def write_json_atomic(path: Path, data: Any, *, replace: bool = True) -> bool:
    """Write JSON so that a reader never sees half a file: temp file in the same folder, then rename.

    With replace=False an existing file is kept (the temp file is linked into place, which fails
    atomically when the name is taken, even between hosts on a shared file system); the return
    value says whether this call wrote the file.
    """
    text = jsontext.dumps(data, indent=2, sort_keys=False) + "\n"
    return write_text_atomic(path, text, replace=replace)


def write_text_atomic(path: Path, text: str, *, replace: bool = True) -> bool:
    """Write `text` (UTF-8) the way every file ddpdoctor writes is written: into a temp file
    of the same folder (mkstemp: 0600, a fresh name, O_EXCL), then renamed over `path`. A
    rename replaces a symlink at `path` itself, never the file it points to, so no link is
    followed; a reader sees the old file or the new one, never half of one. replace=False:
    see write_json_atomic."""
    make_private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
