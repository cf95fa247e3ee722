"""prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) at activation, so py-spy may attach without root."""

from __future__ import annotations

import ctypes
import sys

import pytest

from ddpdoctor.runtime import activate, deactivate, ptrace


class FakePrctl:
    """libc's prctl as ctypes gives it: a callable that takes argtypes and restype."""

    def __init__(self, result):
        self.calls = []
        self.result = result

    def __call__(self, *args):
        self.calls.append(args)
        return self.result


class FakeLibc:
    def __init__(self, result=0):
        self.prctl = FakePrctl(result)
        self.calls = self.prctl.calls


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_activation_lets_any_process_of_the_user_trace_the_rank(tmp_path, monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(ptrace, "_libc", lambda: libc)
    monkeypatch.setenv("RANK", "0")
    try:
        assert activate(tmp_path / "run") is not None
    finally:
        deactivate()
    assert libc.calls == [(0x59616D61, 2**64 - 1, 0, 0, 0)]  # PR_SET_PTRACER, ..._ANY
    assert libc.prctl.restype is ctypes.c_int and len(libc.prctl.argtypes) == 5


def test_a_refusal_or_a_missing_libc_is_ignored(monkeypatch):
    monkeypatch.setattr(ptrace, "_libc", lambda: FakeLibc(result=-1))
    assert ptrace.allow_any_tracer() is False

    def no_libc():
        raise OSError("no libc here")

    monkeypatch.setattr(ptrace, "_libc", no_libc)
    assert ptrace.allow_any_tracer() is False


def test_the_real_call_does_not_raise():
    allowed = ptrace.allow_any_tracer()
    yama = sys.platform.startswith("linux") and _exists("/proc/sys/kernel/yama/ptrace_scope")
    # with Yama the kernel agrees; without it prctl fails with EINVAL and nothing is needed
    assert allowed is yama


def _exists(path):
    import os

    return os.path.exists(path)
