"""Real torchrun, two gloo ranks, user scripts run unchanged through the bootstrap.

Three jobs, started side by side when the module's first test runs (each is mostly torch imports
and waiting), each shared by several checks:

    healthy    DDP training (a spawned DataLoader worker on rank 1), eval forwards, every kind of
               point-to-point call, all_gather_object, barrier; then rank 1 sys.exit(3)s and
               torchrun terminates rank 0
    hang       rank 0 blocked in a barrier while rank 1 stays busy in Python, until the test
               makes rank 1 raise
    mismatch   an all_reduce whose size differs across ranks: gloo aborts (SIGABRT)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpdoctor.protocol.events import parse_event_line
from tests.procs import (
    PYTHON,
    Finished,
    background,
    clean_env,
    free_port,
    kill_group,
    wait_for,
)

pytestmark = pytest.mark.integration

HEALTHY = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ddpdoctor
import helper  # next to this script


class Rows(Dataset):  # defined in __main__: a spawned DataLoader worker must find it
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((8,), float(i) / 16)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = {"name": __name__, "argv": sys.argv, "file": __file__, "path0": sys.path[0],
            "helper": helper.VALUE}
    with open(os.path.join(os.environ["OUT_DIR"], f"seen-{rank}.json"), "w") as fh:
        json.dump(seen, fh)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Rows()
    sampler = DistributedSampler(data, shuffle=True)
    # rank 1 loads in a spawned worker process (one is enough: each costs a torch import)
    spawned = dict(num_workers=1, multiprocessing_context="spawn", persistent_workers=True)
    loader = DataLoader(data, batch_size=2, sampler=sampler, **(spawned if rank == 1 else {}))
    # no ddpdoctor.phase() anywhere: the phases come from what the forwards do
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ddpdoctor.log(loss=loss.item())
        model.eval()
        with torch.no_grad():
            model(torch.zeros(2, 8))
        model.train()

    # every kind of point-to-point call, between the two ranks
    peer = 1 - rank
    t = torch.ones(3)
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    else:
        dist.recv(t, 0)
        dist.send(t, 0)
    for work in [dist.isend(t.clone(), peer), dist.irecv(torch.zeros(3), peer)]:
        work.wait()
    ops = [dist.P2POp(dist.isend, t.clone(), peer), dist.P2POp(dist.irecv, torch.zeros(3), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank == 0:
        dist.send_object_list([{"a": 1}], dst=1)
    else:
        dist.recv_object_list([None], src=0)
    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})
    assert gathered == [{"rank": 0}, {"rank": 1}]
    dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        sys.exit(3)  # torchrun reports the code, and terminates rank 0
    while True:  # rank 0 lives on until torchrun's SIGTERM
        time.sleep(0.05)


if __name__ == "__main__":
    main()
"""

HANG = """
import os, time
import torch.distributed as dist


def load_batch(i):
    raise ValueError(f"corrupt record {i}")


dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    dist.barrier()  # waits for rank 1 forever: blocked in C++, GIL released
else:
    while not os.path.exists(os.environ["TRIGGER"]):  # alive, busy in Python, never there
        time.sleep(0.05)
    load_batch(17)
"""

# The classic bug behind a size mismatch: a count per class, sized by what each rank happened
# to see (bincount without minlength). gloo aborts a rank on the size it receives.
MISMATCH = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
labels = torch.tensor([0, 3, 7] if rank == 0 else [1, 9])
counts = torch.bincount(labels).float()  # 8 entries on rank 0, 10 on rank 1
dist.all_reduce(counts)
"""


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def torchrun(script, *args, port):
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--monitor-interval",
        "0.2",
        "-m",
        "ddpdoctor.runtime.bootstrap",
        str(script),
        *args,
    ]


def job_env(run_dir, **extra):
    return clean_env({"DDPDOCTOR_RUN_DIR": str(run_dir), "DDPDOCTOR_HEARTBEAT_S": "0.2", **extra})


def events_of(run_dir, rank):
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    return [e for e in map(parse_event_line, path.read_bytes().split(b"\n")) if e]


def kinds(events, kind):
    return [e for e in events if e["kind"] == kind]


@contextlib.contextmanager
def reaping(run_dir):
    """Kill by pid any rank still alive at the end (torchrun may start ranks in new sessions)."""
    try:
        yield
    finally:
        for rank in (0, 1):
            for hello in kinds(events_of(run_dir, rank), "hello")[:1]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(hello["pid"], signal.SIGKILL)


# -- the module's three torchrun jobs, started side by side -----------------------------------


@dataclass
class Job:
    """One torchrun job running in the background; finish() waits for it (once)."""

    base: Path
    script: Path
    run_dir: Path
    proc: subprocess.Popen
    result: Finished | None = None

    def finish(self, timeout: float) -> Finished:
        if self.result is None:
            try:
                out, err = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(self.proc)
                out, err = self.proc.communicate()
                raise AssertionError(f"{self.script.name} timed out:\n{err[-3000:]}") from None
            self.result = Finished(self.proc.returncode, out, err, 0.0)
        return self.result

    def events(self, rank):
        return events_of(self.run_dir, rank)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job of this module, started at once: they spend most of their time importing torch
    and waiting on each other, so side by side they take little longer than the slowest alone."""
    base = tmp_path_factory.mktemp("torchrun")
    scripts = {
        "healthy": write(base / "healthy" / "job" / "train.py", HEALTHY),
        "hang": write(base / "hang" / "hang.py", HANG),
        "mismatch": write(base / "mismatch" / "mismatch.py", MISMATCH),
    }
    write(base / "healthy" / "job" / "helper.py", "VALUE = 42\n")
    args = {"healthy": ("--lr", "0.1")}
    extra = {
        # the bucket hook (--ddp-buckets): every gradient bucket numbered with the other calls
        "healthy": {"OUT_DIR": str(base / "healthy"), "DDPDOCTOR_DDP_BUCKETS": "1"},
        "hang": {"TRIGGER": str(base / "hang" / "fail-now")},
    }
    with contextlib.ExitStack() as stack:
        started = {}
        for name, script in scripts.items():
            home = base / name
            run_dir = home / "run"
            stack.enter_context(reaping(run_dir))
            cmd = torchrun(script, *args.get(name, ()), port=free_port())
            proc = stack.enter_context(
                background(cmd, env=job_env(run_dir, **extra.get(name, {})), cwd=home)
            )
            started[name] = Job(home, script, run_dir, proc)
        yield started


@pytest.fixture(scope="module")
def healthy(jobs):
    job = jobs["healthy"]
    result = job.finish(timeout=170)
    return job, result, {r: job.events(r) for r in (0, 1)}


@pytest.mark.timeout(200)
def test_every_rank_leaves_the_whole_trail(healthy):
    _, _, events = healthy
    for rank, trail in events.items():
        names = [e["kind"] for e in trail]
        assert names[0] == "hello" and names[-1] == "exit", rank
        assert {"heartbeat", "step", "collective_start", "collective_end", "epoch"} <= set(names)
        assert all(e["rank"] == rank for e in trail)
        hellos = kinds(trail, "hello")
        assert hellos[-1]["backend"] == "gloo" and hellos[-1]["world_size"] == 2
        steps = kinds(trail, "step")
        assert [s["step"] for s in steps] == list(range(1, 9))  # 8 per rank per 2 epochs
        assert all(s["batch_size"] == 2 and isinstance(s["loss"], float) for s in steps)
        assert [s["epoch"] for s in steps] == [0] * 4 + [1] * 4
        epochs = kinds(trail, "epoch")
        assert [(e["epoch"], e["batches"], e["samples"]) for e in epochs] == [(0, 4, 8), (1, 4, 8)]
        assert kinds(trail, "warning") == []  # set_epoch was called every epoch
        assert kinds(trail, "error") == []


@pytest.mark.timeout(200)
def test_phases_follow_the_forwards_of_a_script_that_names_none(healthy):
    _, _, events = healthy
    for trail in events.values():
        phases = [(e["phase"], e["previous"]) for e in kinds(trail, "phase")]
        assert phases == [
            ("train", "init"),
            ("eval", "train"),
            ("train", "eval"),
            ("eval", "train"),
        ]
        # the first step event comes after the switch to train, the last before the last eval
        order = [e["kind"] if e["kind"] != "phase" else e["phase"] for e in trail]
        assert order.index("train") < order.index("step")
        beats = {b["phase"] for b in kinds(trail, "heartbeat")}
        assert beats <= {"init", "train", "eval"}


@pytest.mark.timeout(200)
def test_sys_exit_code_reaches_torchrun_and_the_peer_dies_of_sigterm(healthy):
    _, result, events = healthy
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "exitcode  : 3" in output, output[-3000:]
    one = kinds(events[1], "exit")
    assert [(e["code"], e["reason"]) for e in one] == [(3, "sys.exit")]
    zero = kinds(events[0], "exit")
    # torchrun terminates the survivor; it says so before dying of the signal
    assert [(e["code"], e["reason"], e["signal"]) for e in zero] == [(-15, "signal", "SIGTERM")]


@pytest.mark.timeout(200)
def test_ranks_agree_on_collective_sequence_numbers(healthy):
    _, _, events = healthy

    def collectives(trail):
        return [
            (e["group"], e["seq"], e["op"], e.get("bucket"), tuple(map(tuple, e["shapes"])))
            for e in kinds(trail, "collective_start")
            if not e.get("p2p")
        ]

    assert collectives(events[0]) == collectives(events[1])
    ops = [c[2] for c in collectives(events[0])]
    assert ops.count("all_reduce") >= 8  # the gradient buckets of 8 steps
    assert ops[-2:] == ["all_gather_object", "barrier"]  # counted once, not their inner calls
    buckets = [e for e in kinds(events[0], "collective_start") if "bucket" in e]
    assert len(buckets) >= 8

    def p2p(trail):
        return [
            (e["peer"], e["seq"], e["op"]) for e in kinds(trail, "collective_start") if e.get("p2p")
        ]

    # point-to-point calls count per peer: both ranks made the same number with each other
    zero, one = p2p(events[0]), p2p(events[1])
    # (batch_isend_irecv names its peer too: the ops it batches all go to one rank here)
    assert [(seq, peer) for peer, seq, _ in zero if peer is not None] == [
        (seq, 1) for seq in range(1, 7)
    ]
    assert [(seq, peer) for peer, seq, _ in one if peer is not None] == [
        (seq, 0) for seq in range(1, 7)
    ]
    assert [op for _, _, op in zero] == [
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "send_object_list",
    ]
    assert [op for _, _, op in one] == [
        "recv",
        "send",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "recv_object_list",
    ]
    batch = [e for e in kinds(events[0], "collective_start") if e["op"] == "batch_isend_irecv"]
    assert batch[0]["peer"] == 1 and batch[0]["shapes"] == [[3], [3]]  # all its ops go to rank 1


@pytest.mark.timeout(200)
def test_every_collective_ends(healthy):
    _, _, events = healthy
    counted = []
    for trail in events.values():
        started = defaultdict(set)
        ended = defaultdict(set)
        for e in kinds(trail, "collective_start"):
            started[(e["group"], e.get("peer"), e["op"])].add(e["seq"])
        for e in kinds(trail, "collective_end"):
            assert e["ok"], e
            ended[(e["group"], e.get("peer"), e["op"])].add(e["seq"])
        assert started == ended
        # every beat after the first call counts it (a rank held 5 s in its start on a loaded
        # machine can train and exit between two beats: then it has no such beat)
        first = min(e["t"] for e in kinds(trail, "collective_start"))
        later = [h for h in kinds(trail, "heartbeat") if h["t"] > first + 0.05]
        assert all(h["collectives_started"] >= 1 for h in later), later
        counted += later
    assert counted  # one rank at least beat while it trained


@pytest.mark.timeout(200)
def test_the_script_saw_what_plain_torchrun_would_show_it(healthy):
    job, _, _ = healthy
    script = job.script
    for rank in (0, 1):
        seen = json.loads((job.base / f"seen-{rank}.json").read_text())
        assert seen["argv"] == [str(script), "--lr", "0.1"]
        assert seen["name"] == "__main__"
        assert seen["file"] == str(script)
        assert seen["path0"] == str(script.parent)
        assert seen["helper"] == 42


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.timeout(200)
def test_a_rank_in_a_barrier_shows_as_in_it_while_the_other_keeps_beating(jobs):
    job = jobs["hang"]
    run_dir, script = job.run_dir, job.script
    trigger = job.base / "fail-now"
    raise_line = (
        script.read_text().splitlines().index('    raise ValueError(f"corrupt record {i}")') + 1
    )

    def in_barrier():
        beats = kinds(events_of(run_dir, 0), "heartbeat")
        # past the start's barrier #1, where rank 0 may wait a while for a late rank 1
        inside = [
            b for b in beats if b["open"] and b["open"]["op"] == "barrier" and b["open"]["seq"] >= 2
        ]
        return inside if len(inside) >= 3 else None

    inside = wait_for(in_barrier, timeout=150, what="rank 0 to sit in the barrier")
    # rank 0's heartbeat thread runs while its main thread is blocked in C++
    assert inside[0]["open"]["seq"] == 2 and inside[0]["open"]["group"] == "default"
    assert inside[-1]["seq"] > inside[0]["seq"]
    assert len({b["open"]["since_mono"] for b in inside}) == 1
    since = inside[0]["open"]["since_t"]
    # rank 1 is alive (heartbeats keep coming after rank 0 entered) but never got there
    later = [b for b in kinds(events_of(run_dir, 1), "heartbeat") if b["t"] > since]
    assert len(later) >= 2 and all(b["open"] is None for b in later)
    one_starts = kinds(events_of(run_dir, 1), "collective_start")
    assert [(s["op"], s["seq"]) for s in one_starts] == [("barrier", 1)]

    trigger.touch()  # now rank 1 raises: an exception on one rank
    result = job.finish(timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "exitcode  : 1" in output
    assert "ValueError: corrupt record 17" in output  # the usual traceback, on the rank's stderr
    assert "bootstrap.py" not in output
    trail = events_of(run_dir, 1)
    (error,) = kinds(trail, "error")
    assert error["exc_type"] == "ValueError" and error["message"] == "corrupt record 17"
    assert f'File "{script}", line {raise_line}, in load_batch' in error["traceback"]
    assert error["location"] == {"file": str(script), "line": raise_line, "function": "load_batch"}
    assert (trail[-1]["kind"], trail[-1]["code"], trail[-1]["reason"]) == ("exit", 1, "exception")
    # rank 0: its barrier fails when rank 1 goes, or torchrun's SIGTERM comes first
    last = events_of(run_dir, 0)[-1]
    assert last["kind"] == "exit" and last["reason"] in ("exception", "signal")


@pytest.mark.timeout(200)
def test_a_size_mismatch_leaves_each_ranks_call_on_disk(jobs):
    job = jobs["mismatch"]
    result = job.finish(timeout=170)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Received data size doesn't match expected size" in output, output[-3000:]
    assert "exitcode  : -6" in output  # gloo aborted a rank (SIGABRT)
    trails = {rank: job.events(rank) for rank in (0, 1)}
    calls = {
        rank: [
            (e["seq"], e["shapes"], e["dtypes"], e["numel"])
            for e in kinds(trail, "collective_start")
            if e["op"] == "all_reduce"
        ]
        for rank, trail in trails.items()
    }
    # what the monitor needs to name it: the same call (#2) with different shapes
    assert calls == {0: [(2, [[8]], ["float32"], 8)], 1: [(2, [[10]], ["float32"], 10)]}
    # gloo aborts the rank that received too much, sometimes both; a survivor fails on the
    # closed connection. An aborted rank writes no more: its start was on disk before the call.
    aborted = [rank for rank, trail in trails.items() if not kinds(trail, "exit")]
    assert aborted
    for rank in aborted:
        assert kinds(trails[rank], "collective_start")[-1]["op"] == "all_reduce"
