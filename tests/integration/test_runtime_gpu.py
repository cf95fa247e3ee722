"""The GPU path for real: NCCL ops end when their CUDA work ends, not when Python returns.

Skipped without an NVIDIA GPU (tests/conftest.py); the same paths run with injected probes in
tests/unit/runtime/test_runtime_completion.py.
"""

from __future__ import annotations

import textwrap

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime.ddp_contract import SYNC_OP
from tests.procs import PYTHON, clean_env, free_port, run

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

SCRIPT = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddpdoctor.runtime as rt

runtime = rt.activate()
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)  # warm-up: NCCL communicator creation
torch.cuda.synchronize()

marks = {}
torch.cuda._sleep(int(2e9))  # ~1 s of GPU work queued ahead of the collective
marks["returned_blocking"] = time.time()
dist.all_reduce(x)  # returns at once: enqueued behind the sleep
marks["after_blocking"] = time.time()
torch.cuda._sleep(int(2e9))
work = dist.all_reduce(x, async_op=True)
marks["returned_async"] = time.time()
torch.cuda.synchronize()
marks["synchronized"] = time.time()

model = DDP(torch.nn.Linear(256, 256).cuda(), device_ids=[0])
for _ in range(3):
    model(torch.randn(64, 256, device="cuda")).sum().backward()
torch.cuda.synchronize()
time.sleep(0.5)  # the heartbeat thread polls the last events
print(json.dumps(marks))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_nccl_ops_end_when_the_gpu_is_done(tmp_path):
    script = tmp_path / "gpu_job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run_dir = tmp_path / "run"
    env = clean_env(
        {
            "DDPDOCTOR_RUN_DIR": str(run_dir),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "DDPDOCTOR_HEARTBEAT_S": "0.2",
        }
    )
    result = run([PYTHON, str(script)], timeout=150, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    marks = json.loads(result.stdout.strip().splitlines()[-1])
    events = [
        e
        for e in map(
            parse_event_line, (run_dir / "events" / "rank-0.jsonl").read_bytes().split(b"\n")
        )
        if e
    ]
    # the script's own calls: DDP's gradient syncs are counted on a group of their own, whose
    # sequence numbers start at 1 too
    calls = [e for e in events if e.get("op") != SYNC_OP]
    ends = {e["seq"]: e for e in calls if e["kind"] == "collective_end" and "bucket" not in e}
    starts = {e["seq"]: e for e in calls if e["kind"] == "collective_start"}
    blocking, asynchronous = ends[2], ends[3]
    # the blocking call returned almost at once, but its end came from the CUDA event later
    assert blocking["via"] == "cuda_event"
    assert marks["after_blocking"] - marks["returned_blocking"] < 0.5
    assert blocking["duration_s"] > 0.5
    assert asynchronous["via"] == "work" and asynchronous["duration_s"] > 0.3
    assert starts[2]["shapes"] == [[1 << 20]] and starts[2]["dtypes"] == ["float32"]
    hello = [e for e in events if e["kind"] == "hello"][-1]
    assert hello["backend"] == "nccl" and hello["device"] == "cuda:0"
    buckets = [e for e in events if e["kind"] == "collective_end" and e["op"] == "all_reduce"]
    assert buckets and all(e["ok"] for e in buckets)
    beats = [e for e in events if e["kind"] == "heartbeat"]
    assert any((b["gpu_mem_bytes"] or 0) > 0 for b in beats)
