"""classify_line for the live log panel, every rule's own examples, and the documented ids."""

from __future__ import annotations

import re

import pytest

from ddpdoctor.explain import LineClass, classify_line, explain_lines
from ddpdoctor.explain.catalog import DESCRIPTIONS, all_rules
from tests.procs import REPO

RULES = all_rules()


@pytest.mark.parametrize(
    ("rule_id", "example"),
    [(r.id, example) for r in RULES for example in r.examples],
)
def test_every_rule_recognises_its_examples(rule_id, example):
    found = classify_line(example)
    assert found is not None
    expected = None if rule_id.startswith("benign.") else rule_id
    assert found.finding_id == expected


def test_every_rule_has_an_example_and_needles_that_occur_in_it():
    for rule in RULES:
        assert rule.examples, rule.id
        for example in rule.examples:
            assert any(n in example for n in rule.needles), (rule.id, example)


def test_every_finding_id_is_described_and_in_the_documentation():
    section = (REPO / "docs" / "explain.md").read_text(encoding="utf-8")
    section = section.split("<!-- section:explain -->")[1].split("<!-- /section:explain -->")[0]
    documented = set(re.findall(r"^\| `([\w.]+)` \|", section, flags=re.M))
    rule_ids = {r.id for r in RULES if not r.id.startswith("benign.")}
    assert rule_ids <= set(DESCRIPTIONS)
    assert set(DESCRIPTIONS) == documented
    for stack_id in ("stacks.ptrace_denied", "stacks.pyspy_missing", "stacks.capture_failed"):
        assert f"`{stack_id}`" in section


def test_levels_for_the_log_panel():
    timeout = classify_line(
        "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE) ran for 600060 "
        "milliseconds before timing out."
    )
    assert timeout == LineClass("error", "watchdog.timeout")
    teardown = classify_line(
        "[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire process "
        "down."
    )
    assert teardown == LineClass("warn", "watchdog.teardown")
    sigterm = classify_line(
        "W1122 04:11:38.009000 8954 torch/distributed/elastic/multiprocessing/api.py:1028] "
        "Sending process 8964 closing signal SIGTERM"
    )
    assert sigterm == LineClass("info", "torchrun.sigterm_peers")


def test_benign_lines_are_info_without_a_finding():
    line = "worker:101542:101542 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so)"
    assert classify_line(line) == LineClass("info", None)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("[rank1]:[E1122 04:12:08.388551894 ProcessGroupGloo.cpp:68] [Rank 1]: odd", "error"),
        ("E1122 04:11:38.073000 8954 torch/distributed/elastic/api.py:1002] boom", "error"),
        ("[rank0]: ValueError: bad value", "error"),
        ("ERROR: something broke", "error"),
        ("[W1122 04:13:03.242252186 socket.cpp:469] [c10d] waitForInput: poll returned 0", "warn"),
        ("/app/train.py:12: UserWarning: this is deprecated", "warn"),
    ],
)
def test_unknown_errors_and_warnings_still_get_a_level(line, level):
    assert classify_line(line) == LineClass(level, None)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "epoch 3 step 120 loss 0.4312",
        "ArchLinux:6482:6500 [0] NCCL INFO Channel 00/04 :    0   1",
        "rank 0 done",
    ],
)
def test_ordinary_lines_are_not_classified(line):
    assert classify_line(line) is None


def test_classification_agrees_with_explain_for_single_lines():
    for rule in RULES:
        if not rule.emits or rule.generic:
            continue
        for example in rule.examples:
            assert rule.id in {f.id for f in explain_lines([example])}, (rule.id, example)
