"""proc_tree.descendants on a real process tree: a child that starts a grandchild."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from ddpdoctor.launchers import proc_tree
from tests.procs import kill_group

# The child starts a grandchild, prints its pid, and both sleep until killed.
TREE = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(g.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def tree():
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        grandchild = int(proc.stdout.readline())
        yield proc.pid, grandchild
    finally:
        kill_group(proc)


def test_finds_children_and_grandchildren(tree):
    child, grandchild = tree
    me = psutil.Process()
    assert sorted(proc_tree.descendants(child)) == [grandchild]
    assert {child, grandchild} <= set(proc_tree.descendants(me.pid))
    # the same answer as psutil's scan of every process
    assert set(proc_tree.descendants(me.pid)) == {p.pid for p in me.children(recursive=True)}


def test_without_children_files_it_falls_back_to_scanning(tree, monkeypatch):
    child, grandchild = tree
    monkeypatch.setattr(proc_tree, "_from_children_files", lambda pid: None)
    assert proc_tree.descendants(child) == [grandchild]


def test_a_process_that_has_gone_has_none(tree):
    child, grandchild = tree
    psutil.Process(grandchild).kill()
    psutil.Process(child).kill()
    deadline = time.monotonic() + 10
    while proc_tree.descendants(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc_tree.descendants(child) == []
    assert proc_tree.descendants(2**22 + 12345) == []  # beyond pid_max: never existed
