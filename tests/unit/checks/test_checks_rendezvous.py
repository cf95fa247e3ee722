"""Rendezvous checks with injected facts: init methods, file:// paths, filesystems, locking."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from ddpdoctor.checks import rendezvous
from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.model import Status
from ddpdoctor.checks.probes.fs import DirStatus, FileStatus, LockResult, find_mount, parse_mounts
from ddpdoctor.checks.probes.net import Resolution

NEVER = threading.Event()

# Recorded /proc/mounts lines, one per filesystem kind a rendezvous file may land on.
MOUNTS = """\
/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev,size=8g 0 0
overlay /workspace overlay rw,relatime,lowerdir=/l,upperdir=/u,workdir=/w 0 0
nas01:/export/home /home nfs4 rw,relatime,vers=4.2,rsize=1048576,hard,proto=tcp 0 0
nas02:/scratch /nfs/nolock nfs rw,relatime,vers=3,nolock,proto=tcp 0 0
10.1.0.5@o2ib:/lfs /lustre lustre rw,flock,lazystatfs 0 0
scratch1 /gpfs/scratch1 gpfs rw,relatime 0 0
beegfs_nodev /mnt/beegfs beegfs rw,relatime,cfgFile=/etc/beegfs/beegfs-client.conf 0 0
10.2.0.1:6789:/ /mnt/ceph ceph rw,relatime,name=admin 0 0
sshfs#me@h:/x /mnt/sshfs fuse.sshfs rw,nosuid,nodev,user_id=0 0 0
/dev/sdb1 /mnt/my\\040disk xfs rw 0 0
"""


@dataclass
class FakeFs:
    dirs: dict[str, DirStatus] = field(default_factory=dict)
    files: dict[str, FileStatus] = field(default_factory=dict)
    mounts_text: str = MOUNTS
    lock: LockResult = field(default_factory=lambda: LockResult(True))
    stuck_lock: bool = False

    def dir_status(self, path):
        return self.dirs.get(path, DirStatus(path, True, True, True))

    def file_status(self, path):
        return self.files.get(path, FileStatus(path, exists=False))

    def mount_for(self, path):
        return find_mount(parse_mounts(self.mounts_text), path)

    def lock_test(self, directory):
        if self.stuck_lock:
            NEVER.wait()
        return self.lock


class FakeNet:
    def resolve(self, host):
        if host in ("10.0.0.1", "master"):
            return Resolution(host, ("10.0.0.1",))
        return Resolution(host, error="Name or service not known")


def ctx(init_method, fs=None, **options) -> CheckContext:
    return CheckContext(
        env={},
        options=DoctorOptions(smoke=False, init_method=init_method, **options),
        probes=Probes(fs=fs or FakeFs(), net=FakeNet()),
    )


# --- init method ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "status", "needle"),
    [
        (None, Status.PASS, "env://"),
        ("env://", Status.PASS, "env://"),
        ("tcp://master:29500", Status.PASS, "master:29500 (10.0.0.1)"),
        ("tcp://no.such.host:29500", Status.FAIL, "does not resolve"),
        ("tcp://10.0.0.1:99999", Status.FAIL, "the port 99999 of tcp://10.0.0.1:99999 is outside"),
        ("tcp://10.0.0.1:http", Status.FAIL, "is not a port number"),
        ("tcp://10.0.0.1", Status.FAIL, "names no port"),
        ("tcp://:29500", Status.FAIL, "names no host"),
        ("file:///shared/init", Status.PASS, "/shared/init"),
        ("file://shared/init", Status.WARN, "names the file '/init'"),
        ("foo://", Status.FAIL, "unknown init method 'foo://'"),
        ("/shared/init", Status.FAIL, "scheme (none)"),
    ],
)
def test_init_method(method, status, needle):
    result = rendezvous.init_method(ctx(method))
    assert result.status is status, result
    assert needle in result.summary
    if status is Status.FAIL and "unknown" in needle:
        assert "env://, tcp://HOST:PORT or file:///PATH" in result.fix


def test_file_host_part_fix_spells_three_slashes():
    result = rendezvous.init_method(ctx("file://shared/init"))
    assert "file:///shared/init" in result.fix


# --- the rendezvous file --------------------------------------------------------------------------


def test_file_check_skips_other_schemes():
    assert rendezvous.rendezvous_file(ctx("env://")).status is Status.SKIP
    assert rendezvous.rendezvous_file(ctx("tcp://master:1")).status is Status.SKIP


def test_missing_directory_fails_with_mkdir():
    fs = FakeFs(dirs={"/nope/dir": DirStatus("/nope/dir", False, False, False, "does not exist")})
    result = rendezvous.rendezvous_file(ctx("file:///nope/dir/init", fs))
    assert result.status is Status.FAIL
    assert "/nope/dir" in result.summary and "does not exist" in result.summary
    assert "mkdir -p /nope/dir" in result.fix


def test_read_only_directory_fails_with_the_reason():
    fs = FakeFs(dirs={"/ro": DirStatus("/ro", True, True, False, "Read-only file system")})
    result = rendezvous.rendezvous_file(ctx("file:///ro/init", fs))
    assert result.status is Status.FAIL
    assert "cannot create files in /ro: Read-only file system" in result.summary


def test_directory_that_is_a_file_fails():
    fs = FakeFs(dirs={"/f": DirStatus("/f", True, False, False, "not a directory")})
    assert rendezvous.rendezvous_file(ctx("file:///f/init", fs)).status is Status.FAIL


def test_stale_file_fails_with_the_rm_command():
    stale = FileStatus("/home/u/init", True, True, 1234, 0, time.time() - 7200)
    fs = FakeFs(files={"/home/u/init": stale})
    result = rendezvous.rendezvous_file(ctx("file:///home/u/init", fs))
    assert result.status is Status.FAIL
    assert "already exists (1234 bytes, modified 2 h ago)" in result.summary
    assert "rm -f /home/u/init" in result.fix
    assert "ddp-init-$SLURM_JOB_ID" in result.fix


def test_empty_existing_file_warns():
    fs = FakeFs(files={"/home/u/init": FileStatus("/home/u/init", True, True, 0, 0, time.time())})
    result = rendezvous.rendezvous_file(ctx("file:///home/u/init", fs))
    assert result.status is Status.WARN
    assert "brand new" in result.summary and "rm -f /home/u/init" in result.fix


def test_existing_directory_at_the_path_fails():
    fs = FakeFs(files={"/home/u/init": FileStatus("/home/u/init", True, False, 4096)})
    assert rendezvous.rendezvous_file(ctx("file:///home/u/init", fs)).status is Status.FAIL


@pytest.mark.parametrize(
    ("path", "fs_type", "kind", "multi_status"),
    [
        ("/home/u/init", "nfs4", "shared", Status.PASS),
        ("/lustre/proj/init", "lustre", "shared", Status.PASS),
        ("/gpfs/scratch1/u/init", "gpfs", "shared", Status.PASS),
        ("/mnt/beegfs/init", "beegfs", "shared", Status.PASS),
        ("/mnt/ceph/init", "ceph", "shared", Status.PASS),
        ("/tmp/init", "tmpfs", "local", Status.WARN),
        ("/dev/shm/init", "tmpfs", "local", Status.WARN),
        ("/workspace/init", "overlay", "local", Status.WARN),
        ("/var/init", "ext4", "local", Status.WARN),
        ("/mnt/my disk/init", "xfs", "local", Status.WARN),
        ("/mnt/sshfs/init", "fuse.sshfs", "unknown", Status.PASS),
        ("/nfs/nolock/init", "nfs", "shared", Status.WARN),
    ],
)
def test_filesystem_kind_from_recorded_mounts(path, fs_type, kind, multi_status):
    single = rendezvous.rendezvous_file(ctx(f"file://{path}"))
    assert single.status is Status.PASS
    assert single.facts["fs_type"] == fs_type and single.facts["fs_kind"] == kind
    multi = rendezvous.rendezvous_file(ctx(f"file://{path}", nnodes=2))
    assert multi.status is multi_status, multi.summary
    if multi_status is Status.WARN:
        assert fs_type in multi.summary or "nolock" in multi.summary
        assert "env://" in multi.fix


def test_lock_failure_fails():
    fs = FakeFs(lock=LockResult(False, "No locks available"))
    result = rendezvous.rendezvous_file(ctx("file:///home/u/init", fs))
    assert result.status is Status.FAIL
    assert "No locks available" in result.summary and "lockd" in result.fix
    assert result.facts["lock_ok"] is False


def test_a_lock_that_never_returns_is_bounded(monkeypatch):
    monkeypatch.setattr(rendezvous, "LOCK_TIMEOUT_S", 0.1)
    start = time.monotonic()
    result = rendezvous.rendezvous_file(ctx("file:///home/u/init", FakeFs(stuck_lock=True)))
    assert time.monotonic() - start < 2.0
    assert result.status is Status.FAIL and "did not return within 0.1 s" in result.summary


def test_clean_file_passes_with_every_fact():
    result = rendezvous.rendezvous_file(ctx("file:///home/u/init"))
    assert result.status is Status.PASS
    assert result.facts["lock_ok"] is True and result.facts["mount_point"] == "/home"
    assert len(result.details) == 3


# --- /proc/mounts parsing -------------------------------------------------------------------------


def test_find_mount_takes_the_longest_mount_point_and_the_last_of_a_tie():
    mounts = parse_mounts(MOUNTS + "tmpfs /tmp tmpfs ro 0 0\n")
    assert find_mount(mounts, "/tmp/x").options == ("ro",)
    assert find_mount(mounts, "/tmpfoo").mount_point == "/"
    assert find_mount(mounts, "/mnt/my disk").fs_type == "xfs"
    assert find_mount(mounts, "/").fs_type == "ext4"
    assert find_mount([], "/x") is None


def test_parse_mounts_skips_garbage():
    assert parse_mounts("garbage\n\n") == []
