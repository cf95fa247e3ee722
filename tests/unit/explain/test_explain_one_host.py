"""gloo's full-mesh connect failing over loopback: a loopback host name on a job across nodes
(an error with its fix), but on one machine loopback is the right address, and the failure is
a peer that died or stalled while the group formed (a consequence, never a loopback error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.explain import explain_files
from ddpdoctor.findings import Severity

MESH = (
    "[rank0]: RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/"
    "transport/tcp/pair.cc:144] no error, remote=[127.0.0.1]:41583 (rank=0, size=2, "
    "local=[127.0.0.1])\n"
)
KILLED = (
    "E1129 05:15:50.772000 21093 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: -9) local_rank: 1 (pid: 21266) of binary: /usr/bin/python\n"
)


def _run_dir(root: Path, nnodes: int | None, hosts: tuple[str, ...] = ("vm",)) -> Path:
    (root / "events").mkdir(parents=True)
    if nnodes is not None:
        (root / "run.json").write_text(json.dumps({"schema_version": 1, "nnodes": nnodes}))
    for rank, host in enumerate(hosts):
        hello = {"v": 1, "t": 1.0, "mono": 1.0, "rank": rank, "kind": "hello", "host": host}
        hello.update(local_rank=0, pid=4242 + rank)
        (root / "events" / f"rank-{rank}.jsonl").write_text(json.dumps(hello) + "\n")
    logs = root / "logs" / hosts[0] / "job" / "attempt_0" / "0"
    logs.mkdir(parents=True)
    (logs / "stderr.log").write_text(MESH)
    (root / "logs" / hosts[0] / "torchrun.log").write_text(KILLED)
    return root


@pytest.mark.parametrize("nnodes", [1, None])  # the launch says one node, or the hellos do
def test_a_one_machine_job_gets_no_loopback_error(tmp_path, nnodes):
    found = {f.id: f for f in explain_files([_run_dir(tmp_path / "run", nnodes)])}
    assert "gloo.loopback" not in found
    mesh = found["gloo.connect_failed"]
    assert "on this machine" in mesh.summary and "died or stalled" in mesh.summary
    assert mesh.severity is not Severity.ERROR or not any(
        f.severity is Severity.ERROR and f.id != "gloo.connect_failed" for f in found.values()
    )
    assert mesh.evidence and "connectFullMesh" in mesh.evidence[0].text


def test_the_same_error_on_a_job_across_nodes_is_the_loopback_error(tmp_path):
    found = {f.id: f for f in explain_files([_run_dir(tmp_path / "run", 2)])}
    assert found["gloo.loopback"].severity is Severity.ERROR
    across = _run_dir(tmp_path / "hellos", None, hosts=("h1", "h2"))
    assert "gloo.loopback" in {f.id for f in explain_files([across])}


def test_a_log_file_alone_says_nothing_of_the_nodes_and_keeps_the_loopback_error(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text(MESH)
    assert "gloo.loopback" in {f.id for f in explain_files([log])}
