"""launch/hangup.py: SIGHUP detaches ddpdoctor from its terminal instead of ending it."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from tests.procs import clean_env

pytestmark = pytest.mark.timeout(60)

# On a terminal: SIGHUP to itself under Hangup, then it keeps writing (to what was the terminal)
# and exits 0; without the handler SIGHUP's default action ends it.
PROGRAM = """
import os, signal, sys
from ddpdoctor.launch.hangup import Hangup
with Hangup().installed() as hangup:
    os.kill(os.getpid(), signal.SIGHUP)
    print("after the hangup: goes nowhere", flush=True)
    assert os.isatty(1) is False  # the terminal's descriptor now leads to /dev/null
    sys.stderr.write(f"happened={hangup.happened}\\n")
"""


def test_sighup_detaches_from_the_terminal_and_the_process_goes_on(tmp_path):
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", PROGRAM],
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
            env=clean_env(),
            text=True,
        )
        os.close(slave)
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert err.strip() == "happened=True"
