"""At a clean exit the runtime destroys a gloo group the script left standing (torch's flight
recorder thread otherwise may abort the finished process in teardown); never after an
exception or a signal, where collectives may still be pending."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ddpdoctor.runtime import core
from ddpdoctor.runtime.exit_hooks import release_gloo_group


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _runtime(hint: core.ExitHint | None) -> core.Runtime:
    runtime = core.Runtime.__new__(core.Runtime)
    runtime.exit_hint = hint
    return runtime


def test_a_clean_exit_releases_the_group(one_rank_group):
    release_gloo_group(_runtime(None))
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "hint", [core.ExitHint(1, "exception"), core.ExitHint(-15, "signal", "SIGTERM")]
)
def test_an_exit_cut_short_leaves_the_group_alone(one_rank_group, hint):
    release_gloo_group(_runtime(hint))
    assert dist.is_initialized()


def test_no_group_is_nothing_to_do():
    release_gloo_group(_runtime(None))
    assert not dist.is_initialized()
