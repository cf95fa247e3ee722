"""The script checkup: the upstream DDP examples are clean, each broken variant gives exactly its
rule at the marked line (`# <- rule-id`), each fixed variant gives nothing, and ignore comments work."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ddpdoctor.checks.scriptcheck import check_scripts, script_results
from ddpdoctor.checks.scriptcheck.rulebase import RULES
from ddpdoctor.findings import Severity

CORPUS = Path(__file__).resolve().parents[3] / "tests" / "corpus"
UPSTREAM = sorted([*CORPUS.glob("ddp_tutorial_series/*.py"), *CORPUS.glob("ddp_example/*.py")])
BROKEN = sorted(CORPUS.glob("broken/*.py"))
MARK = re.compile(r"# <- (script\.[a-z_]+)")
PRINT = "script.print_every_rank"


def expected_marks(path: Path) -> set[tuple[str, int]]:
    lines = path.read_text().splitlines()
    return {(m.group(1), n) for n, line in enumerate(lines, 1) if (m := MARK.search(line))}


def problems(findings) -> list:
    return [f for f in findings if f.severity is not Severity.INFO]


@pytest.mark.parametrize("path", UPSTREAM, ids=lambda p: p.name)
def test_upstream_examples_give_no_warning_or_error(path: Path) -> None:
    assert problems(check_scripts([str(path)])) == []


def test_upstream_corpus_is_all_there() -> None:
    names = {p.name for p in UPSTREAM}
    assert {"multigpu.py", "multigpu_torchrun.py", "multinode.py", "single_gpu.py"} <= names
    assert {"datautils.py", "example.py"} <= names


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_variant_gives_exactly_its_rule_at_its_line(path: Path) -> None:
    expected = expected_marks(path)
    assert expected, f"{path.name} has no `# <- rule` mark"
    found = {(f.rule, f.line) for f in check_scripts([str(path)])}
    if PRINT not in {rule for rule, _ in expected}:
        found = {(rule, line) for rule, line in found if rule != PRINT}
    assert found == expected


def test_every_rule_has_a_broken_variant() -> None:
    marked = {rule for path in BROKEN for rule, _ in expected_marks(path)}
    assert {r.id for r in RULES} <= marked


# Each broken variant's fix: the same code, done right. None may give its rule (or any warning).
CLEAN = {
    "script.set_epoch_missing": """
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler

        def train(dataset, model, epochs):
            dist.init_process_group("gloo")
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, batch_size=8, sampler=sampler)
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                for x, y in loader:
                    model(x).sum().backward()
            dist.destroy_process_group()
        """,
    "script.shuffle_with_sampler": """
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler

        def train(dataset):
            dist.init_process_group("gloo")
            loader = DataLoader(dataset, shuffle=False, sampler=DistributedSampler(dataset))
            plain = DataLoader(dataset, shuffle=True, sampler=None)
            dist.destroy_process_group()
            return loader, plain
        """,
    "script.fully_shard_rank_dependent": """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        def main(model, layers):
            dist.init_process_group("gloo")
            for layer in layers:
                fully_shard(layer)
            fully_shard(model)
            if dist.get_rank() == 0:
                print(model)
            dist.destroy_process_group()
        """,
    "script.requires_grad_rank_dependent": """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        def main(model, freeze_embeddings):
            dist.init_process_group("gloo")
            if freeze_embeddings:
                model.embed.weight.requires_grad_(False)
            for p in model.head.parameters():
                p.requires_grad = False
            fully_shard(model)
            dist.destroy_process_group()
        """,
    "script.full_state_dict_rank_zero": """
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.fsdp import fully_shard

        def main(model):
            dist.init_process_group("gloo")
            fully_shard(model)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(model, options=options)
            if dist.get_rank() == 0:
                torch.save(state, "model.pt")
            dist.destroy_process_group()
        """,
    "script.collective_under_rank_guard": """
        import os
        import torch
        import torch.distributed as dist

        def main(flag):
            dist.init_process_group("gloo")
            rank = int(os.environ["RANK"])
            loss = torch.zeros(1)
            dist.all_reduce(loss)
            if rank == 0:
                print(loss)
            else:
                dist.barrier()
            if flag == 0:
                dist.barrier()
            dist.destroy_process_group()
        """,
    "script.device_hardcoded": """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(model):
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            model = model.cuda()
            ddp = DDP(model, device_ids=[local_rank])
            dist.destroy_process_group()
            return ddp
        """,
    "script.device_ids_not_local_rank": """
        import os
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(model, rank):
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = model.to(local_rank)
            ddp = DDP(model, device_ids=[local_rank])
            spawned = DDP(model, device_ids=[rank])
            dist.destroy_process_group()
            return ddp, spawned
        """,
    "script.syncbn_after_ddp": """
        import os
        import torch.distributed as dist
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(model):
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(local_rank)
            model = DDP(model, device_ids=[local_rank])
            dist.destroy_process_group()
        """,
    "script.model_not_on_device": """
        import os
        import torch.distributed as dist
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main():
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = nn.Linear(4, 4)
            model.to(local_rank)
            ddp = DDP(model, device_ids=[local_rank])
            cpu = DDP(nn.Linear(4, 4))
            dist.destroy_process_group()
            return ddp, cpu
        """,
    "script.checkpoint_every_rank": """
        import torch
        import torch.distributed as dist

        def save(model, path):
            torch.save(model.state_dict(), "checkpoint.pt")

        def main(model, epochs):
            dist.init_process_group("gloo")
            for epoch in range(epochs):
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), f"checkpoint_{epoch}.pt")
                    save(model, "x")
                torch.save(model.state_dict(), f"rank{dist.get_rank()}.pt")
            dist.destroy_process_group()
        """,
    "script.print_every_rank": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("gloo")
            if dist.get_rank() == 0:
                print("starting")
            dist.destroy_process_group()
        """,
    "script.init_hardcoded_rank": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("gloo")
            dist.destroy_process_group()
        """,
    "script.master_port_hardcoded": """
        import os
        import torch.distributed as dist

        def main():
            os.environ.setdefault("MASTER_PORT", "29500")
            dist.init_process_group("gloo")
            dist.destroy_process_group()
        """,
    "script.init_method_port_hardcoded": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("gloo", init_method="env://")
            dist.destroy_process_group()
        """,
    "script.download_every_rank": """
        import torch.distributed as dist
        import torchvision

        def main():
            dist.init_process_group("gloo")
            if dist.get_rank() == 0:
                torchvision.datasets.MNIST("data", download=True)
            dist.barrier()
            data = torchvision.datasets.MNIST("data", download=False)
            dist.destroy_process_group()
            return data
        """,
    "script.spawn_without_main_guard": """
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def worker(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
        """,
    "script.find_unused_parameters": """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(model):
            dist.init_process_group("gloo")
            ddp = DDP(model)
            dist.destroy_process_group()
            return ddp
        """,
    "script.destroy_missing": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("gloo")
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()
        """,
}


def write(tmp_path: Path, text: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.parametrize("rule_id", sorted(CLEAN))
def test_fixed_variant_gives_nothing(tmp_path: Path, rule_id: str) -> None:
    findings = check_scripts([write(tmp_path, CLEAN[rule_id])])
    assert [f for f in findings if f.rule == rule_id] == []
    assert problems(findings) == []


def test_every_rule_has_a_fixed_variant() -> None:
    assert {r.id for r in RULES} == set(CLEAN)


def test_ddp_forward_under_rank_guard_is_a_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(model, rank):
            dist.init_process_group("gloo")
            ddp = DDP(model)
            if rank == 0:
                ddp(torch.zeros(1))
            dist.destroy_process_group()
        """,
    )
    [found] = check_scripts([path])
    assert (found.rule, found.line, found.severity) == (
        "script.collective_under_rank_guard",
        10,
        Severity.WARNING,
    )


def test_rank_guard_needs_a_provable_rank(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch.distributed as dist

        def main(step):
            dist.init_process_group("gloo")
            if step == 0:
                dist.barrier()
            dist.destroy_process_group()
        """,
    )
    assert check_scripts([path]) == []


IGNORED = """
    import torch.distributed as dist

    def main():
        dist.init_process_group("gloo", world_size=2, rank=0)  # ddpdoctor: ignore{tag}
"""


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "[script.init_hardcoded_rank,script.destroy_missing]",
        "[ script.destroy_missing , script.init_hardcoded_rank ]",
    ],
)
def test_ignore_comment_silences_the_line(tmp_path: Path, tag: str) -> None:
    assert check_scripts([write(tmp_path, IGNORED.format(tag=tag))]) == []


def test_ignore_comment_names_only_its_rules(tmp_path: Path) -> None:
    path = write(tmp_path, IGNORED.format(tag="[script.destroy_missing]"))
    assert [f.rule for f in check_scripts([path])] == ["script.init_hardcoded_rank"]


def test_local_imports_are_followed(tmp_path: Path) -> None:
    write(
        tmp_path,
        """
        import torch.distributed as dist

        def setup():
            dist.init_process_group("gloo", world_size=4)
            dist.destroy_process_group()
        """,
        name="helpers.py",
    )
    main = write(tmp_path, "from helpers import setup\n\nsetup()\n")
    [found] = check_scripts([main])
    assert found.rule == "script.init_hardcoded_rank"
    assert found.path == str(tmp_path / "helpers.py") and found.line == 5


def test_set_epoch_in_a_local_module_counts(tmp_path: Path) -> None:
    write(tmp_path, "def start(sampler, epoch):\n    sampler.set_epoch(epoch)\n", name="util.py")
    broken = (CORPUS / "broken" / "set_epoch_missing.py").read_text()
    main = write(tmp_path, "import util\n" + broken)
    assert [f for f in check_scripts([main]) if f.rule == "script.set_epoch_missing"] == []


def test_bad_files_give_findings_not_exceptions(tmp_path: Path) -> None:
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    deep = write(tmp_path, "x = " + "(" * 5000 + ")" * 5000 + "\n", name="deep.py")
    findings = check_scripts([str(binary), deep, str(tmp_path / "missing.py")])
    assert {f.rule for f in findings} <= {"script.unreadable", "script.syntax_error"}
    assert len(findings) == 3
    assert all(f.severity is Severity.ERROR for f in findings)


def test_finding_json_follows_the_finding_contract() -> None:
    path = str(CORPUS / "broken" / "shuffle_with_sampler.py")
    [found] = check_scripts([path])
    data = found.to_json()
    assert {"id", "severity", "summary", "fix", "evidence"} <= set(data)
    assert data["id"] == "script.shuffle_with_sampler" and data["severity"] == "error"
    assert data["evidence"] == [{"file": path, "line": 9, "text": found.text}]
    assert "sampler=sampler" in found.text


def test_doctor_results_one_per_problem_and_a_pass_per_clean_script() -> None:
    broken = str(CORPUS / "broken" / "collective_under_rank_guard.py")
    clean = str(CORPUS / "ddp_tutorial_series" / "multigpu.py")
    results = script_results([broken, clean])
    assert [(r.id, r.status.value, r.title) for r in results] == [
        ("script.collective_under_rank_guard", "fail", f"{broken}:12"),
        ("script.collective_under_rank_guard", "fail", f"{broken}:15"),
        ("script.checkup", "pass", clean),
    ]
    assert results[0].fix and results[0].facts["line"] == 12
    assert "2 notes" in results[2].summary


def test_a_script_with_problems_keeps_its_info_notes_in_the_first_problems_facts(
    tmp_path: Path,
) -> None:
    """doctor.json holds every finding, so a run's diagnosis can cite a note (a fixed port)."""
    path = write(
        tmp_path,
        """\
        import os
        import torch.distributed as dist
        os.environ["MASTER_PORT"] = "12355"
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            dist.barrier()
        dist.destroy_process_group()
        """,
    )
    [result] = script_results([path])
    assert (result.id, result.status.value) == ("script.collective_under_rank_guard", "fail")
    assert result.facts["block"] == [6, 6]  # the `if` body: a rank stuck in it is the symptom
    [note] = result.facts["notes"]
    assert note["id"] == "script.master_port_hardcoded" and note["severity"] == "info"
    assert note["evidence"] == [
        {"file": path, "line": 3, "text": 'os.environ["MASTER_PORT"] = "12355"'}
    ]


def test_every_rule_is_in_the_documentation_table() -> None:
    page = (CORPUS.parents[1] / "docs" / "doctor.md").read_text(encoding="utf-8")
    start, end = "<!-- section:doctor-script -->", "<!-- /section:doctor-script"
    section = page.split(start)[1].split(end)[0]
    documented = set(re.findall(r"^\| `(script\.\w+)` \|", section, flags=re.M))
    assert documented == {r.id for r in RULES}


def test_package_imports_only_the_shared_vocabulary() -> None:
    allowed = {"ddpdoctor.findings", "ddpdoctor.errors", "ddpdoctor.checks.model"}
    package = CORPUS.parents[1] / "ddpdoctor" / "checks" / "scriptcheck"
    for path in package.glob("*.py"):
        imported = set(re.findall(r"^\s*from (ddpdoctor[\w.]*) import", path.read_text(), re.M))
        imported |= set(re.findall(r"^\s*import (ddpdoctor[\w.]*)", path.read_text(), re.M))
        outside = {m for m in imported if not m.startswith("ddpdoctor.checks.scriptcheck")}
        assert outside <= allowed, (path.name, outside)
