"""The reference job's command line and the per-device defaults."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.reference.config import ReferenceConfig, parse_config, reference_argv
from ddpdoctor.reference.inject import parse_inject


def test_defaults():
    cfg = parse_config([])
    assert cfg == ReferenceConfig()
    assert (cfg.steps, cfg.batch_size, cfg.backend, cfg.injects) == (40, 32, "auto", ())


def test_device_dependent_defaults():
    cfg = ReferenceConfig()
    assert (cfg.model_for(False), cfg.model_for(True)) == ("cnn", "resnet18")
    assert (cfg.workers_for(False), cfg.workers_for(True)) == (0, 2)
    assert (cfg.backend_for(False), cfg.backend_for(True)) == ("gloo", "nccl")
    pinned = ReferenceConfig(model="cnn", workers=3, backend="gloo")
    assert (pinned.model_for(True), pinned.workers_for(True), pinned.backend_for(True)) == (
        "cnn",
        3,
        "gloo",
    )


def test_round_trip_of_what_the_launcher_passes():
    injects = (parse_inject("hang:rank=1,step=3"), parse_inject("slow:rank=0,seconds=0.1"))
    argv = reference_argv(
        steps=7, model="cnn", data="/d", batch_size=8, workers=1, backend="gloo", injects=injects
    )
    cfg = parse_config(argv)
    assert (cfg.steps, cfg.model, cfg.data, cfg.batch_size, cfg.workers) == (7, "cnn", "/d", 8, 1)
    assert cfg.backend == "gloo" and cfg.injects == injects


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--model", "vgg"],
        ["--inject", "boom:rank=0"],
        ["--bogus"],
        ["--workers", "-1"],
    ],
)
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(UsageError):
        parse_config(argv)
