"""The jobs false_alarms.py and alarm_rates.py run: every corpus of tests/corpus as a `Job`.

Each job is what comes after `ddpdoctor run --no-tui --no-doctor` (its flags, then `--json`, then
its arguments: a script or a COMMAND after `--`, or the reference job's flags), with the verdict
and culprit ranks that are right for it.

    healthy set: the run corpus's healthy jobs (tests/corpus/run: pytorch/examples' DDP scripts
                 adapted to the CPU, tutorial recipes where rank 0 downloads, evaluates or
                 checkpoints while the others wait); the framework corpus's (Lightning,
                 accelerate, the HF Trainer, run as `ddpdoctor run ... -- COMMAND`); the FSDP
                 corpus's (FSDP2 on 1-D and 2x2 HSDP meshes, TP+DP, DDP accumulation); the
                 pipeline corpus's (GPipe / 1F1B, send/recv by hand); the Ray corpus's (Ray
                 Train's TorchTrainer and actors, each on a local cluster its `ray.init()`
                 starts); the DeepSpeed corpus's (ZeRO-2/3 under the `deepspeed` launcher and
                 under torchrun, DS_ACCELERATOR=cpu; its `paired_by_chance` jobs, where rank 0
                 evaluates alone under ZeRO-3, are healthy with their warning
                 collective.chance_pairing expected); the mismatch corpus's valid per-rank
                 settings (gradient_as_bucket_view on rank 0 only); the replica corpus's healthy
                 jobs (tests/corpus/replicas: per-rank dropout seeds, HSDP, ZeRO-1, DeepSpeed
                 ZeRO-2 `--healthy`, 2 ranks, and 4-rank HSDP); the recovery corpus's (torchrun
                 --max-restarts, a rank failing once) and the torchft corpus's (a lighthouse and
                 two replica groups; a replica killed once that heals), which recover: a warning
                 is expected for them.
    faulty set:  the run corpus's faulty jobs and the framework, FSDP, pipeline, Ray, recovery,
                 torchft and DeepSpeed corpora's planted faults; the mismatch corpus's (the rank
                 that left the common path, each class in two styles); the replica corpus's
                 diverging jobs (mismatch: a reload or an LR scheduler on rank 0 alone, HSDP and
                 ZeRO-1 and DeepSpeed ZeRO-2 included); sample_jobs' broken scripts; the
                 reference job with `--inject hang|crash|mismatch|exit` on rank 1.

Job names carry their corpus: `fw-`, `fsdp-`, `pp-`, `ray-`, `recover-`, `torchft-`, `ds-`,
`mismatch-`, `replica-`, `sample-`, `inject-` (the run corpus's are bare), so `--only ds-` picks
a corpus. DeepSpeed's jobs import its CPU shared-memory op from ~/.cache/torch_extensions: build
it once first (tests/integration/test_deepspeed_runs.py does), or the first jobs build it.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus" / "run"
FRAMEWORKS = REPO / "tests" / "corpus" / "frameworks"
FSDP = REPO / "tests" / "corpus" / "fsdp"
RAY = REPO / "tests" / "corpus" / "ray"
PIPELINES = REPO / "tests" / "corpus" / "pipelines"
RECOVER = REPO / "tests" / "corpus" / "recover"
TORCHFT = REPO / "tests" / "corpus" / "torchft"
DEEPSPEED = REPO / "tests" / "corpus" / "deepspeed"
MISMATCH = REPO / "tests" / "corpus" / "mismatch"
REPLICAS = REPO / "tests" / "corpus" / "replicas"
SAMPLES = REPO / "sample_jobs"
RUN_TIMEOUT_S = 240.0
RAY_TIMEOUT_S = 600.0  # a local Ray cluster takes minutes to start on a loaded 2-core machine
# DeepSpeed's launcher, Lightning's and torchrun with their ranks each import torch (and DeepSpeed
# or Lightning): over 290 s at a load average of 20-29 on two cores (test_mismatch_culprits.py)
SLOW_START_TIMEOUT_S = 600.0
REFERENCE = ("--steps", "8")


@dataclass(frozen=True)
class Job:
    name: str
    args: tuple[
        str, ...
    ]  # after `ddpdoctor run ... --json`: a script after `--`, or reference flags
    verdicts: frozenset[str] = frozenset({"healthy"})  # the right verdicts
    culprits: tuple[int, ...] = ()
    # any of `culprits`, not all of them: every rank fails alike (GPU code on a CPU machine), or
    # two ranks' calls differ with no majority (each side is right)
    culprits_any: bool = False
    # before `--json`: torchrun's size for a script; a COMMAND (the framework corpus) starts its
    # own processes
    flags: tuple[str, ...] = ("--nproc", "2", "--backend", "gloo")
    timeout_s: float = RUN_TIMEOUT_S
    recovers: bool = False  # fails once and is restarted by its launcher: warnings expected
    # warnings that are the right answer for a job that recovers (a replica that died and
    # healed is named at warning severity): not an alarm
    expected: frozenset[str] = frozenset()
    env: tuple[tuple[str, str], ...] = ()  # set for the job on top of the benchmark's environment


def framework_command(words: Sequence[str], folder: Path = FRAMEWORKS) -> tuple[str, ...]:
    """A framework corpus command: its script made absolute, `python` / `torchrun` /
    `accelerate` taken from this interpreter's environment."""
    words = [str(folder / w) if (folder / w).is_file() else w for w in words]
    if words[0] == "python":
        return (sys.executable, *words[1:])
    tool = Path(sys.executable).parent / words[0]
    return (str(tool) if tool.exists() else words[0], *words[1:])


def framework_jobs(kind: str) -> list[Job]:
    manifest = json.loads((FRAMEWORKS / "corpus.json").read_text())
    return [
        Job(
            f"fw-{j['name']}",
            ("--", *framework_command(j["command"])),
            frozenset({j.get("verdict", "healthy")}),
            tuple(j.get("culprits", ())),
            culprits_any=bool(j.get("culprits_any")),
            flags=(),
        )
        for j in manifest[kind]
    ]


def fsdp_jobs(kind: str, corpus: Path = FSDP, prefix: str = "fsdp") -> list[Job]:
    """The FSDP corpus (FSDP2, HSDP and TP+DP meshes, DDP accumulation), each at its own size;
    or another corpus of scripts in the same form (the pipeline corpus)."""
    manifest = json.loads((corpus / "corpus.json").read_text())
    return [
        Job(
            f"{prefix}-{j['name']}",
            ("--", str(corpus / j["script"]), *j["args"]),
            frozenset({j.get("verdict", "healthy")}),
            tuple(j.get("culprits", ())),
            flags=("--nproc", str(j["nproc"]), "--backend", "gloo"),
        )
        for j in manifest[kind]
    ]


def ray_jobs(kind: str) -> list[Job]:
    """The Ray corpus (tests/corpus/ray/corpus.json): TorchTrainer and actor jobs, each on a
    local cluster its `ray.init()` starts."""
    manifest = json.loads((RAY / "corpus.json").read_text())
    return [
        Job(
            j["name"],
            ("--", sys.executable, str(RAY / j["command"][1]), *j["command"][2:]),
            frozenset({j.get("verdict", "healthy")}),
            tuple(j.get("culprits", ())),
            flags=(),
            timeout_s=RAY_TIMEOUT_S,
        )
        for j in manifest[kind]
    ]


def recover_jobs(kind: str) -> list[Job]:
    """The recovery corpus (tests/corpus/recover/corpus.json): a user's torchrun with
    --max-restarts and a c10d rendezvous on a free port."""
    manifest = json.loads((RECOVER / "corpus.json").read_text())
    jobs = []
    for j in manifest[kind]:
        port = str(_free_port())
        words = [w.replace("{port}", port) for w in j["command"]]
        jobs.append(
            Job(
                f"recover-{j['name']}",
                ("--", *framework_command(words, RECOVER)),
                frozenset({j.get("verdict", "healthy")}),
                tuple(j.get("culprits", ())),
                flags=(),
                # several attempts, each importing torch again (Ray: starting a cluster too)
                timeout_s=RAY_TIMEOUT_S if j.get("ray") else 2 * RUN_TIMEOUT_S,
                recovers=bool(j.get("recovers")),
                # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a store per attempt (docs/recovery.md)
                env=tuple(sorted((j.get("env") or {}).items())),
            )
        )
    return jobs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchft_jobs(kind: str) -> list[Job]:
    """The torchft corpus (tests/corpus/torchft/corpus.json): a lighthouse and two replica
    groups, each its own torchrun, started by one driver; "recovering": a replica killed once
    that heals (healthy, its death a warning)."""
    manifest = json.loads((TORCHFT / "corpus.json").read_text())
    return [
        Job(
            j["name"],
            # the driver's path made absolute; the script it starts is its own argument
            ("--", j["command"][0], str(TORCHFT / j["command"][1]), *j["command"][2:]),
            frozenset({j.get("verdict", "healthy")}),
            tuple(j.get("culprits", ())),
            flags=(),
            timeout_s=RAY_TIMEOUT_S,
            expected=frozenset(j.get("warnings", ())),
        )
        for j in manifest[kind]
    ]


def deepspeed_jobs(kind: str) -> list[Job]:
    """The DeepSpeed corpus (tests/corpus/deepspeed/corpus.json) on CPU: under DeepSpeed's own
    launcher (`ddpdoctor run -- deepspeed --num_gpus N SCRIPT`) or torchrun (`--nproc N`; N the
    entry's "nproc", else 2), its JSON config read from the corpus. "paired_by_chance": rank 0
    evaluates alone under ZeRO-3, its all-gathers pair with rank 1's training ones: the ranks are
    out of step from then on and the job ends in a hang (or, as gloo sees it, a crash) of rank 0.
    A faulty job, whose right answer is that verdict, culprit rank 0, and the warning
    (collective.chance_pairing) said when the pairing happened."""
    manifest = json.loads((DEEPSPEED / "corpus.json").read_text())
    # the venv's own path, not a symlink to it: DeepSpeed rebuilds its CPU op for another path
    venv_bin = Path(sys.prefix).resolve() / "bin"
    jobs = []
    for j in manifest[kind]:
        script = str(DEEPSPEED / j["script"])
        args = [str(DEEPSPEED / a) if a.endswith(".json") else a for a in j["args"]]
        nproc = str(j.get("nproc", 2))  # 4: a pipeline of 2 stages x 2 replicas
        if j["launcher"] == "deepspeed":
            launcher = (str(venv_bin / "deepspeed"), "--num_gpus", nproc)
            words = (*launcher, "--master_port", str(_free_port()), script, *args)
            flags: tuple[str, ...] = ()
        else:
            words, flags = (script, *args), ("--nproc", nproc)
        paired = kind == "paired_by_chance"
        jobs.append(
            Job(
                f"ds-{j['name']}",
                ("--", *words),
                frozenset({"hang", "crash"})
                if paired
                else frozenset({j.get("verdict", "healthy")}),
                (0,) if paired else tuple(j.get("culprits", ())),
                flags=flags,
                timeout_s=SLOW_START_TIMEOUT_S,
                expected=frozenset({"collective.chance_pairing"}) if paired else frozenset(),
                env=(("DS_ACCELERATOR", "cpu"),),
            )
        )
    return jobs


def mismatch_jobs(kind: str) -> list[Job]:
    """The mismatch corpus (tests/corpus/mismatch/corpus.json): FSDP2, DDP, accelerate and
    Lightning jobs written apart from ddpdoctor's own corpora, each a COMMAND (torchrun or
    python) that starts its own ranks."""
    manifest = json.loads((MISMATCH / "corpus.json").read_text())
    return [
        Job(
            f"mismatch-{j['name']}",
            ("--", *framework_command(j["command"], MISMATCH)),
            frozenset({j.get("verdict", "healthy")}),
            tuple(j.get("culprits", ())),
            flags=(),
            timeout_s=SLOW_START_TIMEOUT_S,
        )
        for j in manifest.get(kind, ())
    ]


# tests/corpus/replicas has no manifest: the expectations of tests/integration/test_replicas.py.
# name -> (script, its arguments, ranks, culprits); a healthy job has no culprit
REPLICA_CORPUS: dict[str, tuple[str, tuple[str, ...], int, tuple[int, ...]]] = {
    "seeds": ("healthy_seeds.py", (), 2, ()),
    "hsdp": ("hsdp_healthy.py", (), 2, ()),
    "zero": ("zero_healthy.py", (), 2, ()),
    "zero-join": ("zero_join.py", (), 2, ()),  # uneven inputs under torch's Join
    "deepspeed-zero2": ("ds_reload_rank0.py", ("--healthy",), 2, ()),
    "hsdp4": ("hsdp_healthy.py", (), 4, ()),  # HSDP_SHARD=2: two replicate groups
    "reload-helper": ("reload_helper.py", (), 2, (0,)),
    "reload-inline": ("reload_inline.py", (), 2, (0,)),
    "sched-rank0": ("sched_rank0.py", (), 2, (0,)),
    "sched-continue": ("sched_continue.py", (), 2, (0,)),
    "hsdp-sched-rank0": ("hsdp_sched_rank0.py", (), 2, (0,)),
    "zero-sched-rank0": ("zero_sched_rank0.py", (), 2, (0,)),  # replicas.updates_differ
    "deepspeed-zero2-reload-rank0": ("ds_reload_rank0.py", (), 2, (0,)),  # replicas.updates_differ
    "hsdp4-sched-rank0": ("hsdp_sched_rank0.py", ("--mesh", "2x2"), 4, (0,)),
}


def replica_jobs(kind: str) -> list[Job]:
    """The replica corpus (tests/corpus/replicas): DDP, HSDP, ZeRO-1 and DeepSpeed ZeRO-2 jobs
    that exit 0, run as `ddpdoctor run --nproc N -- SCRIPT`; a diverging one ("faulty") is a
    mismatch of the rank whose replica (or updates) left the others'."""
    jobs = []
    for name, (script, args, nproc, culprits) in REPLICA_CORPUS.items():
        if bool(culprits) != (kind == "faulty"):
            continue
        env = [("DS_ACCELERATOR", "cpu")] if script.startswith("ds_") else []
        if name == "hsdp4":
            env.append(("HSDP_SHARD", "2"))
        jobs.append(
            Job(
                f"replica-{name}",
                ("--", str(REPLICAS / script), *args),
                frozenset({"mismatch" if culprits else "healthy"}),
                culprits,
                flags=("--nproc", str(nproc)),
                timeout_s=SLOW_START_TIMEOUT_S,
                env=tuple(env),
            )
        )
    return jobs


def healthy_jobs() -> list[Job]:
    manifest = json.loads((CORPUS / "corpus.json").read_text())
    return (
        [Job(j["name"], ("--", str(CORPUS / j["script"]), *j["args"])) for j in manifest["healthy"]]
        + framework_jobs("healthy")
        + fsdp_jobs("healthy")
        + fsdp_jobs("healthy", PIPELINES, "pp")
        + ray_jobs("healthy")
        + recover_jobs("healthy")
        + torchft_jobs("healthy")
        + torchft_jobs("recovering")
        + deepspeed_jobs("healthy")
        + mismatch_jobs("healthy")
        + replica_jobs("healthy")
    )


def faulty_jobs() -> list[Job]:
    manifest = json.loads((CORPUS / "corpus.json").read_text())
    jobs = [
        Job(
            j["name"],
            ("--", str(CORPUS / j["script"]), *j["args"]),
            frozenset({j["verdict"]}),
            tuple(j["culprits"]),
        )
        for j in manifest["faulty"]
    ]
    jobs += framework_jobs("faulty")
    jobs += fsdp_jobs("faulty")
    jobs += fsdp_jobs("faulty", PIPELINES, "pp")
    jobs += ray_jobs("faulty")
    jobs += recover_jobs("faulty")
    jobs += torchft_jobs("faulty")
    jobs += deepspeed_jobs("faulty")
    jobs += deepspeed_jobs("paired_by_chance")
    jobs += mismatch_jobs("faulty")
    jobs += replica_jobs("faulty")
    samples = [  # the culprits tests/integration/test_diagnose_jobs.py expects
        ("rank0_only_barrier", {"mismatch"}, (0,)),
        ("uneven_data", {"mismatch", "hang"}, (1,)),
        ("stuck_dataloader", {"hang"}, (1,)),
        ("exception_on_one_rank", {"crash"}, (1,)),
        # each rank's all_reduce has a size of its own (4 and 5): the test names both sides;
        # one side alone (the rank whose abort said it first) is right too
        ("allreduce_size_mismatch", {"mismatch"}, (0, 1)),
    ]
    jobs += [
        Job(
            f"sample-{name}",
            ("--", str(SAMPLES / f"{name}.py")),
            frozenset(verdicts),
            culprits,
            culprits_any=name == "allreduce_size_mismatch",
        )
        for name, verdicts, culprits in samples
    ]
    injected = [("hang", "hang"), ("crash", "crash"), ("mismatch", "mismatch"), ("exit", "crash")]
    jobs += [
        Job(
            f"inject-{kind}",
            (*REFERENCE, "--inject", f"{kind}:rank=1,step=4"),
            frozenset({verdict}),
            (1,),
        )
        for kind, verdict in injected
    ]
    return jobs
