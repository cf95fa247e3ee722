"""Call sites of explicit collectives: the user's line, the framework function it called (via)
and the framework frame that called torch.distributed (issuer), on a real single-process gloo
group, with a framework package laid out as site-packages lays it out."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from ddpdoctor.runtime import call_sites
from tests.runtime_helpers import events

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def framework(tmp_path, monkeypatch):
    """`fakefw`, installed in a site-packages folder: Strategy.barrier -> _issue -> dist.barrier."""
    pkg = tmp_path / "site-packages" / "fakefw"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            import torch.distributed as dist


            def _issue():
                dist.barrier()


            class Strategy:
                def barrier(self):
                    _issue()

                def where(self):
                    from ddpdoctor.runtime import call_sites
                    return call_sites.caller_site(0)
            """
        )
    )
    monkeypatch.syspath_prepend(str(pkg.parent))
    call_sites.forget()
    module = importlib.import_module("fakefw")
    yield module
    sys.modules.pop("fakefw", None)
    call_sites.forget()


def test_kinds_of_files():
    assert call_sites.kind_of(__file__) == call_sites.USER
    assert call_sites.kind_of(torch.__file__) == call_sites.INTERNAL
    assert call_sites.kind_of(call_sites.__file__) == call_sites.INTERNAL
    assert call_sites.kind_of(importlib.__file__) == call_sites.INTERNAL
    lightning = "/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py"
    assert call_sites.kind_of(lightning) == call_sites.FRAMEWORK
    assert call_sites.package_path(lightning) == "lightning/pytorch/strategies/ddp.py"
    # torch's Join makes collectives of its own for a `with Join(...)`: a framework, as the
    # rest of torch is not (the chance-pairing rule knows its shadow calls by it)
    import torch.distributed.algorithms.join as join
    import torch.distributed.distributed_c10d as c10d

    assert call_sites.kind_of(join.__file__) == call_sites.FRAMEWORK
    assert call_sites.package_path(join.__file__) == "torch/distributed/algorithms/join.py"
    assert call_sites.kind_of(c10d.__file__) == call_sites.INTERNAL


def test_a_site_through_framework_code_names_the_user_line_via_and_issuer(framework):
    text = framework.Strategy().where()  # where() is the framework frame both via and issuer
    assert text is not None and text.startswith('"site":{')
    assert __file__ in text and "test_a_site_through_framework_code" in text
    assert '"via":{"file":"fakefw/__init__.py"' in text and "Strategy.where" in text


def test_recorded_barrier_carries_its_site(recording, framework):
    framework.Strategy().barrier()
    line = sys._getframe().f_lineno - 1
    dist.barrier()
    direct = sys._getframe().f_lineno - 1
    starts = [e for e in events(recording, "collective_start") if e["op"] == "barrier"]
    via, plain = starts[-2]["site"], starts[-1]["site"]
    assert (via["file"], via["line"]) == (__file__, line)
    assert via["function"] == "test_recorded_barrier_carries_its_site"
    assert via["via"]["function"] == "Strategy.barrier"
    assert via["issuer"]["function"] == "_issue"
    assert via["via"]["file"] == "fakefw/__init__.py"
    assert (plain["line"], plain["via"]) == (direct, None)
    assert "issuer" not in plain


def test_a_site_is_encoded_once_and_reused(recording):
    call_sites.forget()
    for _ in range(3):
        dist.barrier()
    assert len(call_sites._SITES) == 1
    sites = [e["site"] for e in events(recording, "collective_start")][-3:]
    assert sites[0] == sites[1] == sites[2]


def test_no_user_frame_means_no_site():
    assert call_sites.site_of(None) is None


def test_a_lightning_metric_synced_later_takes_the_line_that_logged_it(recording):
    """`self.log(name, value, sync_dist=True)` in validation_step: Lightning reduces it when it
    computes the epoch's value, from its own loop (no frame of the user's on the stack). Lightning's
    real result collection and sync function, on the one-rank gloo group: the barrier and the
    all-reduce take the site of the log call, marked deferred."""
    result = pytest.importorskip("lightning.pytorch.trainer.connectors.logger_connector.result")
    from lightning.fabric.utilities.distributed import _sync_ddp_if_available

    results = result._ResultCollection(training=False)
    results.log(
        "validation_step", "val_loss", torch.tensor(2.0), sync_dist=True,
        sync_dist_fn=_sync_ddp_if_available, batch_size=1,
    )  # fmt: skip
    logged = sys._getframe().f_lineno - 4
    before = len(events(recording, "collective_start"))
    computed = results.metrics(on_step=False)  # what the epoch's end does: compute, sync
    assert float(computed["callback"]["val_loss"]) == 2.0
    syncs = events(recording, "collective_start")[before:]
    assert [e["op"] for e in syncs] == ["barrier", "all_reduce"] * 2  # the value and its batch size
    for event in syncs:
        site = event["site"]
        assert (site["file"], site["line"], site["deferred"]) == (__file__, logged, True)
        assert site["via"] is None  # logged here directly (LightningModule.log in a real job)


def test_the_metric_wrapper_comes_out_with_the_runtime(tmp_path, monkeypatch):
    result = pytest.importorskip("lightning.pytorch.trainer.connectors.logger_connector.result")
    from ddpdoctor.runtime import deactivate
    from ddpdoctor.runtime.patching import WRAPPED_MARK
    from tests.runtime_helpers import start_recording

    original = result._ResultCollection.log
    start_recording(tmp_path, monkeypatch)
    try:
        assert getattr(result._ResultCollection.log, WRAPPED_MARK) is original
        assert call_sites._ORIGINS
    finally:
        deactivate()
    assert result._ResultCollection.log is original
    assert not call_sites._ORIGINS


def save_checkpoint():
    dist.barrier()  # the helper's collective


def test_a_site_in_a_helper_names_the_users_line_that_called_it(recording):
    save_checkpoint()
    line = sys._getframe().f_lineno - 1
    site = [e for e in events(recording, "collective_start") if e["op"] == "barrier"][-1]["site"]
    assert site["function"] == "save_checkpoint"
    assert site["caller"] == {
        "file": __file__,
        "line": line,
        "function": "test_a_site_in_a_helper_names_the_users_line_that_called_it",
    }
