"""The script checkup's finding, cited by the run's diagnosis: a real `ddpdoctor run` (gloo,
torchrun, the preflight doctor) of a script that runs a DDP forward and backward under
`if rank == 0:`.

A collective or `dist.barrier()` under the rank guard is a checkup *error*, which stops the launch
before the job can show it; a DDP forward there is a *warning* (the launch goes on), and it fails
the same way: rank 0's gradient all-reduce is a collective rank 1 never joins (rank 1 calls the
barrier after it instead). The preflight warns at job.py:LINE; the job then hangs (a mismatch, as
torch's flight recorder sees the barrier meet the all-reduce at one sequence number) with rank 0
at the next line, in its backward, inside the guarded body; ddpdoctor stops it, and the final
diagnosis.json cites job.py:LINE on the finding that states it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import ddpdoctor_cmd, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUN_TIMEOUT_S = 90

JOB = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
if rank == 0:
    loss = model(torch.randn(4, 8)).sum()  # one more batch, on rank 0 alone
    loss.backward()
dist.barrier()
dist.destroy_process_group()
"""
LINE = 15  # the DDP forward under the guard; rank 0 then waits at line 16, in its backward


def test_the_final_diagnosis_cites_the_line_the_preflight_flagged(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--nproc", "2", "--hang-after", "4", "--run-dir", str(run_dir),
        "--", "job.py",
    )  # fmt: skip
    finished = run(cmd, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    out, elapsed = finished.stdout + finished.stderr, finished.elapsed_s

    # the preflight warned (and did not block the launch)
    assert f"job.py:{LINE}: the DDP model's forward runs only under the rank guard" in out, out
    doctor = json.loads((run_dir / "doctor.json").read_text())
    [flagged] = [r for r in doctor["results"] if r["id"] == "script.collective_under_rank_guard"]
    assert flagged["status"] == "warn" and flagged["facts"]["line"] == LINE
    assert doctor["counts"]["fail"] == 0

    final = json.loads((run_dir / "diagnosis.json").read_text())
    assert finished.returncode == 1, out
    assert final["verdict"] in ("hang", "mismatch"), out  # mismatch with the flight recorder
    headline = final["findings"][0]
    assert headline["id"] == final["verdict"] and headline["severity"] == "error"
    assert headline["summary"].endswith(
        f"(the script checkup flagged job.py:{LINE} before the launch)"
    )
    [cited] = [e for e in headline["evidence"] if e["file"] == "job.py"]
    assert cited["line"] == LINE
    assert cited["text"].startswith("the script checkup flagged this before the launch: `")
    assert "[script.collective_under_rank_guard]" in cited["text"]
    assert "one more batch" in cited["text"]  # the source line itself
    assert elapsed < RUN_TIMEOUT_S
