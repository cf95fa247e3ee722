"""The synthetic data set, its cache file, and the cross-rank parameter digest."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.reference.data import (
    CACHE_ENV,
    NUM_CLASSES,
    SyntheticSpec,
    cache_dir,
    generate_synthetic,
    load_synthetic,
    prepare_synthetic,
    validate_synthetic,
)
from ddpdoctor.reference.verify import ParamCheck

SMALL = SyntheticSpec(train_samples=40, test_samples=20, seed=3)


def test_cache_dir_from_env():
    assert cache_dir({CACHE_ENV: "/x/cache"}) == Path("/x/cache")
    assert cache_dir({"XDG_CACHE_HOME": "/y"}) == Path("/y/ddpdoctor")


def test_synthetic_set_is_deterministic_and_cifar_shaped():
    first, again = generate_synthetic(SMALL), generate_synthetic(SMALL)
    assert first["digest"] == again["digest"]
    other = generate_synthetic(SyntheticSpec(40, 20, seed=4))
    assert other["digest"] != first["digest"]
    assert tuple(first["train_x"].shape) == (40, 3, 32, 32)
    assert str(first["train_x"].dtype) == "torch.uint8"
    assert tuple(first["test_y"].shape) == (20,)
    assert sorted(set(first["train_y"].tolist())) == list(range(NUM_CLASSES))


def test_classes_differ_more_than_images_within_a_class():
    """Learnable: an image is closer to its own class's mean than to other classes' means."""
    data = generate_synthetic(SyntheticSpec(400, 20, seed=0))
    x, y = data["train_x"].float().flatten(1), data["train_y"]
    means = [x[y == c].mean(0) for c in range(NUM_CLASSES)]
    nearest = [min(range(NUM_CLASSES), key=lambda c: (img - means[c]).norm()) for img in x[:50]]
    assert sum(int(n == t) for n, t in zip(nearest, y[:50].tolist(), strict=True)) >= 45


def test_prepare_writes_then_validates_then_repairs(tmp_path):
    path, how = prepare_synthetic(tmp_path, SMALL)
    assert how == "generated" and path.name == SMALL.file_name
    assert validate_synthetic(path, SMALL) is None
    assert prepare_synthetic(tmp_path, SMALL)[1] == "validated"
    assert validate_synthetic(path, SyntheticSpec(41, 20, seed=3)) == "wrong size"
    path.write_bytes(b"not a torch file")
    assert validate_synthetic(path, SMALL).startswith("unreadable")
    assert prepare_synthetic(tmp_path, SMALL)[1] == "generated"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_load_gives_normalised_datasets(tmp_path):
    path, _ = prepare_synthetic(tmp_path, SMALL)
    train, test = load_synthetic(path)
    assert (len(train), len(test)) == (40, 20)
    image, label = train[0]
    assert tuple(image.shape) == (3, 32, 32) and -3.0 <= float(image.mean()) <= 3.0
    assert 0 <= int(label) < NUM_CLASSES


def test_param_check():
    same = ParamCheck(digests=("a", "a", "a"))
    assert same.identical and same.differing_ranks() == ()
    split = ParamCheck(digests=("a", "b", "a", "c"))
    assert not split.identical and split.differing_ranks() == (1, 3)


def test_parameters_digest_sees_any_change():
    import torch

    from ddpdoctor.reference.model import small_cnn
    from ddpdoctor.reference.verify import parameters_digest

    torch.manual_seed(0)
    a = small_cnn()
    torch.manual_seed(0)
    b = small_cnn()
    assert parameters_digest(a) == parameters_digest(b)
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6
    assert parameters_digest(a) != parameters_digest(b)


@pytest.mark.parametrize("name", ["cnn"])
def test_build_model_outputs_ten_classes(name):
    import torch

    from ddpdoctor.reference.model import build_model, parameter_count

    model = build_model(name)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, NUM_CLASSES)
    assert 100_000 < parameter_count(model) < 200_000
