"""The TUI follows a LIVE reference job (real torchrun, 2 gloo ranks) with an injected hang.

`ddpdoctor run --no-tui --keep-running` launches the job and leaves it hanging; the app, headless
under Textual's Pilot, follows the run directory through the real Monitor (as `ddpdoctor watch`
does) until the hang verdict, captures py-spy stacks with the `c` key, and on quit (in run mode,
with the launcher as its job) asks, then stops the job: the launcher and every rank end.
"""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.model.snapshot import Verdict
from ddpdoctor.tui.app import DdpDoctorApp
from ddpdoctor.tui.dialogs import QuitRunScreen
from tests.procs import background, clean_env, ddpdoctor_cmd, wait_for
from tests.tui.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.tui]


class LauncherJob:
    """The `ddpdoctor run` process as the TUI's job: stop() is what Ctrl-C to the launcher does."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.stops = 0

    def returncode(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        self.stops += 1
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # the launcher stops its job, then exits


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.timeout(170)
async def test_app_follows_a_live_hang_to_the_hang_verdict(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run",
        "--no-tui",
        "--no-doctor",
        "--nproc",
        "2",
        "--backend",
        "gloo",
        "--steps",
        "400",
        "--inject",
        "hang:rank=1,step=4",
        "--hang-after",
        "3",
        "--keep-running",
        "--run-dir",
        str(run_dir),
    )
    log = (tmp_path / "launcher.log").open("w")
    with background(cmd, env=clean_env(), stdout=log, stderr=subprocess.STDOUT) as proc:
        wait_for(lambda: (run_dir / "run.json").exists(), timeout=60, what="run.json")
        monitor = Monitor(run_dir, hang_after=3.0)
        job = LauncherJob(proc)
        app = DdpDoctorApp(monitor, mode="run", job=job, title="live hang")
        try:
            await follow_the_hang(app, job, proc)
        except AssertionError as exc:
            tail = (tmp_path / "launcher.log").read_text()[-3000:]
            raise AssertionError(f"{exc}\n{describe(app)}\n--- launcher ---\n{tail}") from exc
        finally:
            monitor.close()
            log.close()


def describe(app: DdpDoctorApp) -> str:
    snap = app.snapshot
    if snap is None:
        return f"no snapshot shown (error: {app.poll_error})"
    ranks = ", ".join(f"{rv.rank}:{rv.state.value}@{rv.step}" for rv in snap.ranks)
    return (
        f"verdict {snap.verdict.value}, culprits {sorted(snap.culprits)}, ranks {ranks}, "
        f"stacks {[g.ranks for g in snap.stacks]}, stack status {snap.stack_status!r}, "
        f"error {app.poll_error!r}"
    )


async def follow_the_hang(app: DdpDoctorApp, job: LauncherJob, proc: subprocess.Popen) -> None:
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_until(
            pilot,
            lambda: app.snapshot is not None and app.snapshot.verdict is Verdict.HANG,
            timeout=120,
            what="the hang verdict",
        )
        snap = app.snapshot
        assert snap.culprits == frozenset({1})
        assert app.table.get_cell("r1", "rank").plain.startswith("★")
        assert app.table.get_cell("r0", "state").plain in ("waiting", "stalled")
        assert "HANG" in str(app.diagnosis.render())
        assert "culprit rank 1" in str(app.diagnosis.render())
        pids = [rv.pid for rv in snap.ranks if rv.pid]
        assert len(pids) == 2 and alive(pids) == pids  # keep-running: still there

        # c: real py-spy stacks of both ranks, grouped, in the stacks panel. The
        # launcher's own monitor captures at the hang too, and two py-spy attaching to
        # one process at once can fail: press again until a capture comes through.
        def grouped() -> list[int]:
            return sorted(r for g in app.snapshot.stacks for r in g.ranks)

        for _attempt in range(4):
            await pilot.press("c")
            try:
                await wait_until(
                    pilot, lambda: grouped() == [0, 1], timeout=15, what="py-spy stacks"
                )
                break
            except AssertionError:
                continue
        else:
            pytest.fail(f"no stacks of both ranks: {describe(app)}")
        await pilot.pause(0.3)
        assert "ranks 1 (1 rank)" in str(app.stacks.render())  # the culprit's class, first

        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitRunScreen))
        assert job.stops == 0 and proc.poll() is None
        await pilot.press("y")
        await wait_until(pilot, lambda: job.stops == 1, what="job.stop()")
    wait_for(lambda: proc.poll() is not None, timeout=30, what="the launcher to exit")
    wait_for(lambda: not alive(pids), timeout=30, what="the ranks to end")
    # The last snapshot shown: still the hang with its culprit (the ranks may already
    # show as ended by the stop).
    final = app.return_value
    assert final is not None and final.verdict is Verdict.HANG
    assert final.culprits == frozenset({1})
