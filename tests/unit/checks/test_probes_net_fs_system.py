"""The real network, filesystem and system probes on this machine (fast, local operations only)."""

from __future__ import annotations

import os
import resource
import socket
import sys
import threading

import pytest

from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.checks.probes.fs import RealFsProbe
from ddpdoctor.checks.probes.net import RealNetProbe
from ddpdoctor.checks.probes.system import RealSystemProbe, parse_cpu_max


@pytest.fixture
def listener():
    """A port this test really holds (bound and listening on all IPv4 addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


# --- bounded calls --------------------------------------------------------------------------------


def test_bounded_call_returns_value_error_or_timeout():
    assert bounded_call(lambda: 42, 1.0).value == 42
    failed = bounded_call(lambda: 1 / 0, 1.0)
    assert isinstance(failed.error, ZeroDivisionError) and not failed.ok
    never = threading.Event()
    stuck = bounded_call(never.wait, 0.05)
    assert stuck.timed_out and not stuck.ok


# --- network --------------------------------------------------------------------------------------


def test_resolve_localhost_and_a_name_that_does_not_exist():
    net = RealNetProbe()
    assert any(a.startswith("127.") or a == "::1" for a in net.resolve("localhost").addresses)
    missing = net.resolve("no-such-host.invalid")
    assert not missing.ok and missing.error


def test_bind_test_sees_a_held_port_and_names_its_owner(listener):
    net = RealNetProbe()
    held = net.bind_test(listener)
    assert held.in_use and not held.free
    owners = net.port_owners(listener)
    assert any(o.pid == os.getpid() for o in owners)
    assert any("pytest" in " ".join(o.cmdline) or "python" in (o.name or "") for o in owners)


def test_bind_test_on_a_free_port():
    net = RealNetProbe()
    result = net.bind_test(net.free_port())
    assert result.free and not result.in_use


def test_connect_accepted_and_refused(listener):
    net = RealNetProbe()
    assert net.connect("127.0.0.1", listener, 1.0).ok
    closed = net.free_port()
    refused = net.connect("127.0.0.1", closed, 1.0)
    assert refused.outcome == "refused"
    assert net.connect("no-such-host.invalid", 1, 1.0).outcome == "unresolved"


def test_ancestor_pids_include_this_process_and_its_parent():
    assert {os.getpid(), os.getppid()} <= RealNetProbe().ancestor_pids()


def test_interfaces_include_loopback():
    names = {i.name: i for i in RealNetProbe().interfaces()}
    assert "lo" in names and "127.0.0.1" in names["lo"].addresses


# --- filesystem -----------------------------------------------------------------------------------


def test_dir_and_file_status(tmp_path):
    fs = RealFsProbe()
    assert fs.dir_status(str(tmp_path)).writable
    assert not fs.dir_status(str(tmp_path / "missing")).exists
    target = tmp_path / "init"
    assert not fs.file_status(str(target)).exists
    target.write_text("abc")
    status = fs.file_status(str(target))
    assert status.exists and status.is_file and status.size == 3 and status.uid == os.getuid()
    assert not fs.file_status(str(tmp_path)).is_file


def test_lock_test_works_and_cleans_up(tmp_path):
    assert RealFsProbe().lock_test(str(tmp_path)).ok
    assert list(tmp_path.iterdir()) == []
    assert not RealFsProbe().lock_test(str(tmp_path / "missing")).ok


def test_mount_for_a_path_that_does_not_exist_yet(tmp_path):
    mount = RealFsProbe().mount_for(str(tmp_path / "not" / "yet"))
    assert mount is not None and str(tmp_path).startswith(mount.mount_point)


def test_disk_space():
    fs = RealFsProbe()
    space = fs.disk_space("/")
    assert space is not None and 0 <= space.free_bytes <= space.total_bytes
    assert fs.disk_space("/no/such/dir") is None


# --- system ---------------------------------------------------------------------------------------


def test_limits_match_getrlimit():
    lim = RealSystemProbe().limits()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert lim.nofile_soft == (None if soft == resource.RLIM_INFINITY else soft)


def test_cpus_and_memory():
    probe = RealSystemProbe()
    cpus = probe.cpus()
    assert 1 <= cpus.usable <= cpus.online
    mem = probe.memory()
    assert 0 < mem.available_bytes <= mem.total_bytes


@pytest.mark.parametrize(
    ("text", "cpus"), [("200000 100000", 2.0), ("max 100000", None), ("bad", None)]
)
def test_parse_cpu_max(text, cpus):
    assert parse_cpu_max(text) == cpus


def test_shm_segments_tell_stale_from_in_use(tmp_path):
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    for name in ("nccl-Stale1", "nccl-Held22", f"torch_{dead_pid}_1_0", f"torch_{os.getpid()}_2_0"):
        (tmp_path / name).write_bytes(b"x" * 10)
    (tmp_path / "unrelated").write_bytes(b"")
    with open(tmp_path / "nccl-Held22", "rb"):  # held open by this process
        segments = {s.name: s for s in RealSystemProbe().shm_segments(str(tmp_path))}
    assert set(segments) == {"nccl-Stale1", "nccl-Held22", f"torch_{dead_pid}_1_0",
                             f"torch_{os.getpid()}_2_0"}  # fmt: skip
    assert not segments["nccl-Stale1"].in_use and segments["nccl-Held22"].in_use
    assert not segments[f"torch_{dead_pid}_1_0"].in_use
    assert segments[f"torch_{os.getpid()}_2_0"].in_use
    assert segments["nccl-Stale1"].size == 10


def test_pyspy_from_path_with_its_version(tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho py-spy 9.8.7\n")
    fake.chmod(0o755)
    info = RealSystemProbe().pyspy(str(tmp_path))
    assert info.path == str(fake) and info.version == "9.8.7" and info.error is None


def test_pyspy_that_fails_reports_its_error(tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    info = RealSystemProbe().pyspy(str(tmp_path))
    assert info.error == "broken"


def test_pyspy_missing_from_path_falls_back_to_beside_python(tmp_path):
    info = RealSystemProbe().pyspy(str(tmp_path))
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(beside):
        assert info.path == beside
    else:
        assert info.path is None and info.error == "not found"


def test_ptrace_reads_this_process():
    info = RealSystemProbe().ptrace()
    assert info.is_root == (os.geteuid() == 0)
