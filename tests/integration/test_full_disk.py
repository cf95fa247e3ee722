"""A full run directory never fails the job: on a 2 MiB file system a job that prints 2.4 MB
finishes with exit 0 under ddpdoctor as it does without it, every line it printed reaches the
console, and the verdict says the run directory filled up."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from tests.procs import ddpdoctor_cmd, run

pytestmark = pytest.mark.integration

LINES = 6000  # x 2 ranks x ~200 bytes: more than the file system holds

PRINTER = textwrap.dedent(
    f"""
    import os
    rank = int(os.environ["RANK"])
    for i in range({LINES}):
        print(f"rank {{rank}} line {{i}} " + "x" * 180)
    print(f"rank {{rank}} DONE")
    """
)


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def test_a_full_run_directory_does_not_fail_the_job(small_fs, tmp_path):
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    cmd = ddpdoctor_cmd(
        "run", "--nproc", "2", "--no-tui", "--no-doctor", "--run-dir", str(small_fs / "run"),
        "--", str(script),
    )  # fmt: skip
    done = run(cmd, timeout=240)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} DONE" in out
        seen = {
            line.split(" line ")[1].split()[0]
            for line in out.splitlines()
            if f"rank {rank} line " in line
        }
        assert len(seen) == LINES, (rank, LINES - len(seen))
    assert "run.disk_full: run directory full" in out
    assert "events after step" in out
