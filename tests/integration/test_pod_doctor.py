"""`ddpdoctor doctor --distributed` as a Kubernetes init container, one per pod: two doctors
read torchrun's PET_* variables, and PET_MASTER_ADDR is a name that a DNS server of the test's
own resolves late (a headless service's name, published once the pod has an address) or never
answers for.

Each doctor runs in a mount namespace of its own whose /etc/resolv.conf names only the test's
server on a loopback address (tests.dns_stub): no query leaves the machine. The master's name
resolves to this machine's own non-loopback address, where node 0's doctor serves the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dns_stub import dns_stub, never_answers, private_resolver, routable_address
from tests.procs import PYTHON, REPO, background, clean_env, ddpdoctor_cmd, free_port

pytestmark = pytest.mark.integration

MASTER = "ddp-0.ddp.test"
# torch imported first, then the clock: what --timeout bounds starts once torch is loaded
# (a busy machine takes seconds to import it, before the doctor can do anything)
# (a busy machine takes seconds to import it, before the doctor can do anything). DONE: the
# doctor returned; torch's own teardown follows (seconds under load, nothing to do with the
# network); a doctor that leaves a lookup behind ends with os._exit, without DONE or teardown.
TIMED = (
    "import sys, time, torch, torch.distributed, ddpdoctor.commands.doctor, "
    "ddpdoctor.distributed_doctor.doctor; print(f'LOADED {time.monotonic():.3f}', file=sys.stderr, "
    "flush=True); from ddpdoctor.cli import main; sys.argv[0] = 'ddpdoctor'; code = main(); "
    "print(f'DONE {time.monotonic():.3f}', file=sys.stderr, flush=True); sys.exit(code)"
)


def _skip_reason() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (a DNS server on port 53, a private /etc/resolv.conf)"
    if routable_address() is None:
        return "this machine has no non-loopback IPv4 address to stand for a pod's"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else "unshare --mount is not permitted here"


@dataclass
class Pod:
    returncode: int
    stdout: str
    stderr: str
    after_torch_s: float  # from torch loaded to the doctor's end (DONE, or the process's end)

    def document(self) -> dict:
        assert self.stdout.strip(), f"no report on stdout\n{self.stderr[-3000:]}"
        return json.loads(self.stdout)


def _pods(
    rule: Callable[[int], str], timeout_s: int, workdir: Path, *, limit: float = 180
) -> list[Pod]:
    """Node 0's and node 1's doctors, started at once, each behind a DNS server of its own
    (`rule(node)` answers node's questions for the master's name)."""
    address = routable_address()
    assert address is not None
    port = free_port()
    with contextlib.ExitStack() as servers:
        stubs = [servers.enter_context(dns_stub({MASTER: lambda n=n: rule(n)})) for n in (0, 1)]
        commands = []
        for n, stub in enumerate(stubs):
            (workdir / f"node{n}").mkdir()
            prefix = private_resolver(stub, workdir / f"node{n}", address)
            cmd = [*prefix, PYTHON, "-c", TIMED, "doctor", "--distributed", "--json"]
            commands.append([*cmd, "--timeout", str(timeout_s)])
        with contextlib.ExitStack() as stack:
            files = [
                (
                    stack.enter_context((workdir / f"node{n}.out").open("w")),
                    stack.enter_context((workdir / f"node{n}.err").open("w")),
                )
                for n in (0, 1)
            ]
            procs = [
                stack.enter_context(
                    background(commands[n], env=_pod_env(n, port), cwd=REPO, stdout=out, stderr=err)
                )
                for n, (out, err) in enumerate(files)
            ]
            ended = _wait_all(procs, limit)
    pods = []
    for n, (proc, end) in enumerate(zip(procs, ended, strict=True)):
        out, err = ((workdir / f"node{n}.{kind}").read_text() for kind in ("out", "err"))
        loaded, done = (
            [float(line.split()[1]) for line in err.splitlines() if line.startswith(marker)]
            for marker in ("LOADED", "DONE")
        )
        assert loaded, f"the doctor never loaded torch\n{err[-3000:]}"
        pods.append(Pod(proc.returncode, out, err, (done or [end])[0] - loaded[0]))
    return pods


def _pod_env(node: int, port: int) -> dict[str, str]:
    return clean_env(
        {
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "PET_NNODES": "2",
            "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": MASTER,
            "PET_MASTER_PORT": str(port),
            "PYTHONPATH": str(REPO),
        }
    )


def _wait_all(procs: Sequence[subprocess.Popen], limit: float) -> list[float]:
    """When each process ended (time.monotonic(), the clock every process shares)."""
    ended: dict[int, float] = {}
    give_up = time.monotonic() + limit
    while len(ended) < len(procs):
        if time.monotonic() > give_up:
            pytest.fail(f"the pods' doctors did not end within {limit} s")
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.05)
    return [ended[i] for i in range(len(procs))]


def _result(document: Mapping, check_id: str) -> dict:
    return next(r for r in document["results"] if r["id"] == check_id)


@pytest.fixture(scope="module")
def late_name(tmp_path_factory) -> list[Pod]:
    """The master's name appears 3 s after both pods asked for it (each through its own
    server): each pod asked, and was told it does not exist, before it did."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    asked: dict[int, float] = {}
    address = routable_address()
    assert address is not None

    def appears_once_both_asked(node: int) -> str:
        asked.setdefault(node, time.monotonic())
        both = len(asked) == 2 and time.monotonic() >= max(asked.values()) + 3
        return address if both else "nxdomain"

    return _pods(appears_once_both_asked, 90, tmp_path_factory.mktemp("late"))


def test_a_master_name_that_resolves_late_is_a_pass_everywhere_and_the_pods_start(late_name):
    node0, node1 = late_name
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stdout[-4000:] + node1.stderr
    report = node0.document()
    assert report["exit_code"] == 0 and report["counts"]["fail"] == 0
    # node 0 looked before the name existed (its checks run before it serves the store): the
    # check looked again once the join resolved the name
    local = _result(report, "network.master_addr")
    assert local["status"] == "pass", local
    assert any("did not resolve" in d and "--timeout" in d for d in local["details"]), local
    cross = _result(report, "cluster.master_addr")
    assert cross["status"] == "pass" and cross["summary"].startswith(f"PET_MASTER_ADDR {MASTER}")
    assert "the name did not resolve for" in cross["summary"]
    waits = cross["facts"]["name_wait_s"]
    assert sorted(waits) == ["0", "1"] and all(2.0 <= w <= 90 for w in waits.values()), waits


@pytest.fixture(scope="module")
def dead_dns(tmp_path_factory) -> list[Pod]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    return _pods(lambda node: never_answers(), 8, tmp_path_factory.mktemp("dead"))


def test_a_dns_server_that_never_answers_costs_the_timeout_not_more(dead_dns):
    node0, node1 = dead_dns
    assert (node0.returncode, node1.returncode) == (1, 1), node0.stderr[-3000:]
    # --timeout 8: the other pod's line by then, and the report too, plus the 3 s rank 0 waits
    # for the others to read its exit code (measured before: 34 s, and 83 s for a name that
    # c10d's store looked up itself)
    assert node0.after_torch_s < 8 + 7, node0.after_torch_s
    assert node1.after_torch_s < 8 + 5, node1.after_torch_s
    report = node0.document()
    join = _result(report, "cluster.join")
    assert join["status"] == "fail" and "rank 1 never joined" in join["summary"]
    assert any(
        f"PET_MASTER_ADDR={MASTER} did not resolve on this host (rank 0) within 8 s" in d
        and "no answer from the DNS server" in d
        for d in join["details"]
    ), join
    local = _result(report, "network.master_addr")
    assert local["status"] == "fail" and local["summary"].startswith(f"PET_MASTER_ADDR={MASTER}")
    said = [x for x in node1.stderr.splitlines() if not x.startswith(("LOADED", "DONE"))]
    assert len(said) == 1, said
    line = said[0]
    assert line.startswith("ddpdoctor: error: rank 1: nothing answered at PET_MASTER_ADDR:"), line
    assert "no answer from the DNS server" in line


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"PET_MASTER_PORT": "abc"}, "PET_MASTER_PORT='abc' is not a TCP port"),
        ({"PET_NODE_RANK": "2"}, "PET_NODE_RANK=2 is not below PET_NNODES=2"),
        ({"PET_NNODES": "two"}, "PET_NNODES='two' is not a number of nodes"),
    ],
)
def test_a_bad_pet_value_is_one_line_naming_it(change, words):
    env = {**_pod_env(1, 29500), **change}
    finished = subprocess.run(
        ddpdoctor_cmd("doctor", "--distributed", "--timeout", "5"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: "), lines
    assert words in lines[0] and "RANK=" not in lines[0].replace("NODE_RANK=", "")
