"""Rendezvous checks: the init method, and the file of a file:// rendezvous.

Failure modes F17 (a stale rendezvous file: "each initialization with the file init method will
need a brand new empty file", PyTorch docs) and F18 (a file on a filesystem that is not shared, or
cannot lock: FileStore relies on fcntl locks) in the catalog.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import replace
from urllib.parse import urlparse

from ddpdoctor.checks import net_facts
from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, failed, passed, skipped, warning, worst
from ddpdoctor.checks.net_facts import port_problem, resolve, url_port_text
from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.checks.probes.fs import Mount
from ddpdoctor.checks.registry import check

VALID_SCHEMES = "env://, tcp://HOST:PORT or file:///PATH"
LOCK_TIMEOUT_S = 2.0
# Filesystems that live on one node: a rendezvous file there is invisible to the other nodes.
LOCAL_FS = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "tmpfs",
        "ramfs",
        "overlay",
        "devtmpfs",
        "vfat",
        "exfat",
        "ntfs",
        "ntfs3",
        "reiserfs",
        "jfs",
    }
)
# Filesystems several nodes can mount at once.
SHARED_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cifs",
        "smb3",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.ceph-fuse",
        "fuse.juicefs",
        "fuse.weka",
        "wekafs",
        "panfs",
        "orangefs",
        "pvfs2",
    }
)


def file_path(init_method: str) -> tuple[str, str]:
    """The path torch's FileStore will use for a file:// URL (the URL's path), and its host part.

    `file://tmp/x` has host "tmp" and path "/x": torch uses "/x", which is rarely what was meant.
    """
    parsed = urlparse(init_method)
    return parsed.path, parsed.netloc


def classify_fs(mount: Mount | None) -> str:
    """Whether a mount's filesystem is "local", "shared" or "unknown" to ddpdoctor."""
    if mount is None:
        return "unknown"
    if mount.fs_type in SHARED_FS:
        return "shared"
    if mount.fs_type in LOCAL_FS:
        return "local"
    return "unknown"


@check("rendezvous.init_method", "Init method", timeout_s=10.0)
def init_method(ctx: CheckContext) -> CheckOutcome:
    plan = ctx.plan
    method = plan.init_method
    if plan.scheme == "env":
        return passed(
            "env:// (MASTER_ADDR and MASTER_PORT from the environment; see Network)",
            facts={"init_method": method, "scheme": "env"},
        )
    if plan.scheme == "file":
        path, host = file_path(method)
        if not path:
            return failed(
                f"{method!r} has no path",
                fix="Give the file's absolute path after three slashes: file:///shared/dir/ddp-init.",
            )
        if host:
            return warning(
                f"{method!r} names the file {path!r}: the '{host}' after file:// is a host, "
                "not part of the path",
                fix=f"Write three slashes for an absolute path: file:///{host}{path}.",
                facts={"init_method": method, "scheme": "file", "path": path},
            )
        return passed(
            f"file:// rendezvous through {path}",
            facts={"init_method": method, "scheme": "file", "path": path},
        )
    if plan.scheme == "tcp":
        return _tcp_init_method(ctx, method)
    scheme = plan.scheme or "(none)"
    return failed(
        f"unknown init method {method!r} (scheme {scheme})",
        fix=f"Use one of {VALID_SCHEMES}.",
        facts={"init_method": method, "scheme": plan.scheme},
    )


def _tcp_init_method(ctx: CheckContext, method: str) -> CheckOutcome:
    parsed = urlparse(method)
    host = parsed.hostname
    facts: dict[str, object] = {"init_method": method, "scheme": "tcp", "host": host}
    if not host:
        return failed(
            f"{method!r} names no host",
            fix="Use tcp://MASTER_IP:PORT, e.g. tcp://10.0.0.1:29500.",
            facts=facts,
        )
    port_text = url_port_text(method)
    if port_text is None:
        return failed(
            f"{method!r} names no port",
            fix=f"Add the master's port: tcp://{host}:29500.",
            facts=facts,
        )
    port = int(port_text) if port_text.isdigit() else None
    problem = port_problem(port_text, port, method)
    if problem:
        return problem
    resolution = resolve(ctx, host)
    facts.update(port=port, addresses=resolution.addresses)
    if resolution.timed_out:
        return failed(
            f"{host} did not resolve within {net_facts.RESOLVE_TIMEOUT_S:g} s: the DNS server does not answer",
            fix="Use the master's IP address in the URL instead of a name.",
            facts=facts,
        )
    if not resolution.ok:
        return failed(
            f"the host of {method!r} does not resolve: {resolution.error}",
            fix=f"Use the master's IP address, or a name every node resolves (`getent hosts {host}`).",
            facts=facts,
        )
    return passed(
        f"tcp:// rendezvous at {host}:{port} ({', '.join(resolution.addresses)})", facts=facts
    )


@check("rendezvous.file", "Rendezvous file", timeout_s=10.0)
def rendezvous_file(ctx: CheckContext) -> CheckOutcome:
    if ctx.plan.scheme != "file":
        return skipped(f"the init method is {ctx.plan.scheme or 'unknown'}://, not file://")
    path, _host = file_path(ctx.plan.init_method)
    if not path:
        return skipped("no path in the file:// URL (see Init method)")
    directory = os.path.dirname(path) or "/"
    fs = ctx.probes.fs
    status = fs.dir_status(directory)
    facts: dict[str, object] = {"path": path, "directory": directory}
    if not status.exists:
        return failed(
            f"the directory {directory} of the rendezvous file does not exist",
            fix=f"Create it on a filesystem every node shares: mkdir -p {shlex.quote(directory)}",
            facts=facts,
        )
    if not status.is_dir:
        return failed(
            f"{directory} (the rendezvous file's directory) is not a directory",
            fix="Point file:// at a path inside a directory, e.g. file:///shared/dir/ddp-init.",
            facts=facts,
        )
    if not status.writable:
        return failed(
            f"cannot create files in {directory}: {status.error}",
            fix="Use a directory this user can write to (every rank creates and locks the file "
            "there), on a filesystem every node shares.",
            facts=facts,
        )
    outcomes = [
        _stale_file(ctx, path),
        _filesystem(ctx, directory, facts),
        _locking(ctx, directory),
    ]
    facts["lock_ok"] = outcomes[2].status.value == "pass"
    chosen = worst(o for o in outcomes if o.status.value != "pass")
    details = tuple(o.summary for o in outcomes)
    if chosen is None:
        return passed(
            f"{path} is new, on {facts.get('fs_type', 'an unknown filesystem')}, and fcntl "
            "locking works there",
            details=details,
            facts=facts,
        )
    return replace(chosen, details=details, facts=facts)


def _stale_file(ctx: CheckContext, path: str) -> CheckOutcome:
    existing = ctx.probes.fs.file_status(path)
    if existing.error is not None:
        return failed(
            f"{path} cannot be used as the rendezvous file: {existing.error}",
            fix="Use a short new file name (at most 255 characters per name) in a directory every "
            "node shares, e.g. file:///shared/dir/ddp-init-$SLURM_JOB_ID.",
        )
    if existing.special:
        return failed(
            f"{path} is a device or special file, not a rendezvous file: torch's FileStore "
            "would write the rendezvous into it",
            fix="Point file:// at a new file name in a directory every node shares, e.g. "
            "file:///shared/dir/ddp-init-$SLURM_JOB_ID (never delete the existing one).",
        )
    if not existing.exists:
        return passed(f"{path} does not exist yet (as it must)")
    age = ""
    if existing.mtime is not None:
        age = f", modified {_age(time.time() - existing.mtime)} ago"
    rm = f"rm -f {shlex.quote(path)}"
    unique = f"file://{os.path.dirname(path)}/ddp-init-$SLURM_JOB_ID"
    if not existing.is_file:
        return failed(
            f"{path} exists and is a directory, not a rendezvous file",
            fix="Point file:// at a file name that does not exist yet.",
        )
    if existing.size > 0:
        return failed(
            f"the rendezvous file {path} already exists ({existing.size} bytes{age}): a stale "
            "file from an earlier run breaks or hangs the next init",
            fix=f"Delete it before the launch ({rm}) and give each job its own file, e.g. {unique}.",
        )
    return warning(
        f"the rendezvous file {path} already exists (empty{age}); torch needs a brand new file "
        "for each init",
        fix=f"Delete it before the launch ({rm}); use a file name unique to the job, e.g. {unique}.",
    )


def _filesystem(ctx: CheckContext, directory: str, facts: dict[str, object]) -> CheckOutcome:
    mount = ctx.probes.fs.mount_for(directory)
    kind = classify_fs(mount)
    if mount is not None:
        facts.update(fs_type=mount.fs_type, mount_point=mount.mount_point, fs_kind=kind)
        facts["mount_options"] = list(mount.options)
    where = (
        f"{mount.fs_type} (mounted at {mount.mount_point})" if mount else "an unknown filesystem"
    )
    plan = ctx.plan
    if plan.multi_node and kind == "local":
        return warning(
            f"{directory} is on {where}, local to this node, but the job spans {plan.nnodes} "
            "nodes: the other nodes cannot see the file and each waits on its own",
            fix="Put the file on a filesystem every node mounts (NFS, Lustre, GPFS, BeeGFS, "
            "CephFS) at the same path, or use env:// or tcp:// instead.",
        )
    if plan.multi_node and mount is not None and mount.fs_type.startswith("nfs"):
        local_lock = [o for o in mount.options if o == "nolock" or o.startswith("local_lock=")]
        if any(o in ("nolock", "local_lock=all", "local_lock=posix") for o in local_lock):
            return warning(
                f"{directory} is on NFS mounted with {','.join(local_lock)}: fcntl locks are "
                "local to each node, so ranks on different nodes do not see each other's locks",
                fix="Mount the share with locking (without nolock / local_lock), or use env://.",
            )
    if kind == "unknown" and plan.multi_node:
        return passed(f"{directory} is on {where}; make sure every node mounts it")
    return passed(f"{directory} is on {where} ({kind})")


def _locking(ctx: CheckContext, directory: str) -> CheckOutcome:
    result = bounded_call(lambda: ctx.probes.fs.lock_test(directory), LOCK_TIMEOUT_S, name="lock")
    fix = (
        "Use a filesystem with working fcntl locks (NFS needs its lock daemon: lockd / rpc.statd, "
        "and no 'nolock' mount option), or use env:// instead of file://."
    )
    if result.timed_out:
        return failed(
            f"an fcntl lock in {directory} did not return within {LOCK_TIMEOUT_S:g} s "
            "(NFS without a lock daemon hangs like this)",
            fix=fix,
        )
    if result.error is not None:
        return failed(f"the fcntl lock test in {directory} failed: {result.error}", fix=fix)
    lock = result.value
    if lock is None or not lock.ok:
        return failed(
            f"fcntl locking does not work in {directory}: {lock.error if lock else 'no result'}",
            fix=fix,
        )
    return passed(f"fcntl locking works in {directory}")


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
