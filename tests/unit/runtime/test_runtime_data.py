"""The DistributedSampler audit and per-epoch loader facts."""

from __future__ import annotations

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import activate, deactivate

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402


@pytest.fixture
def recording(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    runtime = activate(tmp_path / "run")
    assert runtime is not None
    yield runtime
    deactivate()


def events(runtime, kind):
    runtime.flush()  # hot-path events are queued for the heartbeat thread
    raw = runtime.run_dir.events_file(0).read_bytes().split(b"\n")
    return [e for e in (parse_event_line(line) for line in raw) if e and e["kind"] == kind]


def loader_for(shuffle=True, rank=0, replicas=2, n=10, batch=2, drop_last=False):
    dataset = TensorDataset(torch.arange(n, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=shuffle)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last), sampler


def test_epoch_restarted_without_set_epoch_warns_once(recording):
    loader, _ = loader_for()
    for _epoch in range(3):
        for _batch in loader:
            pass
    (warning,) = events(recording, "warning")
    assert warning["code"] == "sampler.set_epoch_missing"
    assert "set_epoch" in warning["message"]
    assert warning["details"] == {"epoch": 0, "iterations": 2}
    epochs = events(recording, "epoch")
    assert [e["set_epoch_called"] for e in epochs] == [False, False, False]


def test_set_epoch_every_epoch_is_quiet(recording):
    loader, sampler = loader_for()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for _batch in loader:
            pass
    assert events(recording, "warning") == []
    epochs = events(recording, "epoch")
    assert [(e["epoch"], e["set_epoch_called"]) for e in epochs] == [
        (0, True),
        (1, True),
        (2, True),
    ]


def test_the_same_epoch_number_every_time_is_the_same_mistake(recording):
    loader, sampler = loader_for()
    for _ in range(2):
        sampler.set_epoch(0)
        for _batch in loader:
            pass
    assert [w["code"] for w in events(recording, "warning")] == ["sampler.set_epoch_missing"]


def test_no_shuffle_needs_no_set_epoch(recording):
    loader, _ = loader_for(shuffle=False)
    for _ in range(2):
        list(loader)
    assert events(recording, "warning") == []


def test_epoch_events_carry_batches_and_samples_of_this_rank(recording):
    # 11 samples on 2 ranks: the sampler pads to 6 each; batches of 4 -> 2 (or 1 with drop_last)
    loader, _ = loader_for(n=11, batch=4)
    short, _ = loader_for(n=11, batch=4, drop_last=True, shuffle=False)
    list(loader)
    list(short)
    first, second = events(recording, "epoch")
    assert (first["batches"], first["samples"], first["shuffle"]) == (2, 6, True)
    assert (second["batches"], second["samples"], second["drop_last"]) == (1, 6, True)
    assert first["distributed"] is True and first["loader"] != second["loader"]


def test_plain_loaders_report_their_epochs_too(recording):
    dataset = TensorDataset(torch.arange(6, dtype=torch.float32))
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    list(loader)
    list(loader)
    epochs = events(recording, "epoch")
    assert [(e["epoch"], e["batches"], e["shuffle"], e["distributed"]) for e in epochs] == [
        (0, 2, True, False),
        (1, 2, True, False),
    ]
    assert epochs[0]["set_epoch_called"] is None


def test_peeking_a_batch_before_set_epoch_is_not_an_epoch(recording):
    # pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py, Trainer._run_epoch:
    # it peeks one batch for its log line, then calls set_epoch, then runs the epoch.
    loader, _ = loader_for(n=40, batch=4)
    for epoch in range(3):
        b_sz = len(next(iter(loader))[0])
        assert b_sz == 4
        loader.sampler.set_epoch(epoch)
        for _batch in loader:
            pass
    assert events(recording, "warning") == []


def test_peeking_does_not_hide_a_missing_set_epoch(recording):
    loader, _ = loader_for(n=40, batch=4)
    for _epoch in range(3):
        next(iter(loader))
        for _batch in loader:
            pass
    (warning,) = events(recording, "warning")
    assert warning["code"] == "sampler.set_epoch_missing"
    assert warning["details"] == {"epoch": 0, "iterations": 2}


def test_an_epoch_cut_short_by_its_step_count_is_still_an_epoch(recording):
    # Loops that take exactly len(loader) batches never ask the iterator for one more.
    loader, _ = loader_for(n=40, batch=4)
    for _epoch in range(2):
        batches = iter(loader)
        for _step in range(len(loader)):
            next(batches)
    assert [w["code"] for w in events(recording, "warning")] == ["sampler.set_epoch_missing"]


def test_an_epoch_inside_an_open_join_says_so(recording, world):
    """torch's Join evens ranks of different batch counts: an epoch that starts inside an open,
    enabled `with Join(...)` says so, one outside it or inside a disabled Join does not."""
    from torch.distributed.algorithms import Join  # the package's own name for it
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(1, 1))
    loader = DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)

    def train(loader):
        for (x,) in loader:
            model(x).sum().backward()

    train(loader)
    with Join([model]):
        train(loader)
        with Join([model], enable=False):  # nested and disabled: the outer one still evens
            train(loader)
    with Join([model], enable=False):
        train(loader)
    train(loader)
    assert [e["join"] for e in events(recording, "epoch")] == [False, True, True, False, False]


def test_a_join_that_raises_closes_its_count(recording, world):
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(1, 1))
    loader = DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2)
    with pytest.raises(ValueError), Join([model]):
        list(loader)
        raise ValueError("the user's own error")
    list(loader)
    assert [e["join"] for e in events(recording, "epoch")] == [True, False]
