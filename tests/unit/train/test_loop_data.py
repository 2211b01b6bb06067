"""CIFAR-10 readers/writer, synthetic data, deterministic tensor augmentation, models."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from train.errors import DataError
from train.loop.data import (
    Augmenter,
    describe_data,
    load_data,
    make_synthetic,
    read_cifar10,
    write_cifar10,
)
from train.loop.models import build_model, split_stages
from train.spec.config import DataConfig


@pytest.fixture(scope="module")
def small() -> tuple:
    return make_synthetic(60, seed=1, split="train"), make_synthetic(20, seed=1, split="test")


@pytest.mark.parametrize("fmt", ["binary", "python"])
def test_roundtrip_through_the_standard_formats(tmp_path: Path, small: tuple, fmt: str) -> None:
    train, test = small
    out = write_cifar10(tmp_path / "cifar-10-batches", train, test, fmt=fmt)
    suffix = ".bin" if fmt == "binary" else ""
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"data_batch_{i}{suffix}" for i in range(1, 6)] + [f"test_batch{suffix}"]
    )
    for root in (out, tmp_path):  # the batch directory or its parent (cifar-10-batches-*)
        if root == tmp_path:
            (tmp_path / f"cifar-10-batches-{'bin' if fmt == 'binary' else 'py'}").symlink_to(out)
        got_train, got_test = read_cifar10(root)
        assert torch.equal(got_train.images, train.images)
        assert torch.equal(got_train.labels, train.labels)
        assert torch.equal(got_test.images, test.images)
        assert got_train.images.dtype == torch.uint8 and got_train.images.shape[1:] == (3, 32, 32)


def test_binary_record_layout(tmp_path: Path, small: tuple) -> None:
    train, test = small
    write_cifar10(tmp_path, train, test)
    raw = np.fromfile(tmp_path / "test_batch.bin", dtype=np.uint8).reshape(-1, 3073)
    assert raw[0, 0] == test.labels[0]
    assert np.array_equal(raw[0, 1:1025], test.images[0, 0].numpy().ravel())  # red plane first


def test_bad_files(tmp_path: Path, small: tuple) -> None:
    with pytest.raises(DataError, match="no CIFAR-10 data"):
        read_cifar10(tmp_path)
    write_cifar10(tmp_path, *small)
    (tmp_path / "data_batch_3.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="not a multiple of the 3073-byte"):
        read_cifar10(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(DataError, match="missing"):
        read_cifar10(tmp_path)


def test_pickle_reader_refuses_code(tmp_path: Path, small: tuple) -> None:
    write_cifar10(tmp_path, *small, fmt="python")

    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    with (tmp_path / "data_batch_2").open("wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(DataError, match=r"refusing to load builtins\.print"):
        read_cifar10(tmp_path)


def test_synthetic_is_deterministic_and_balanced() -> None:
    a = make_synthetic(500, seed=3, split="train")
    b = make_synthetic(500, seed=3, split="train")
    c = make_synthetic(500, seed=3, split="test")
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images[:100], c.images[:100])
    assert a.labels.bincount(minlength=10).min() > 20


def test_synthetic_with_path_goes_through_the_reader(tmp_path: Path) -> None:
    cfg = DataConfig(train_size=50, test_size=10, path=str(tmp_path / "syn"))
    train, test = load_data(cfg, seed=0)
    assert (tmp_path / "syn" / "data_batch_1.bin").is_file()
    assert torch.equal(train.images, make_synthetic(50, seed=0, split="train").images)
    assert len(test) == 10


def test_augmentation_is_exact_and_seeded_per_step(small: tuple) -> None:
    train, _ = small
    aug = Augmenter(torch.device("cpu"), augment=True, seed=0)
    x = train.images[:16]
    a = aug(x, epoch=1, step=2, rank=0)
    assert torch.equal(a, aug(x, epoch=1, step=2, rank=0))  # same key, same crops
    assert not torch.equal(a, aug(x, epoch=1, step=3, rank=0))
    assert not torch.equal(a, aug(x, epoch=1, step=2, rank=1))
    # Splitting a step's batch into micro-batches does not change its augmentation.
    crops = aug.draw(16, epoch=1, step=2, rank=0)
    halves = torch.cat([aug.apply(x[:8], crops, 0), aug.apply(x[8:], crops, 8)])
    assert torch.equal(halves, a)
    # The global RNG is untouched.
    state = torch.get_rng_state()
    aug(x, epoch=0, step=0, rank=0)
    assert torch.equal(state, torch.get_rng_state())


def test_crop_and_flip_are_what_they_claim(small: tuple) -> None:
    train, _ = small
    x = train.images[:32]
    flip_only = Augmenter(torch.device("cpu"), augment=True, seed=0, pad=0)
    out = flip_only(x, epoch=0, step=0, rank=0)
    plain = flip_only.normalize(x)
    flipped = [torch.equal(out[i], plain[i].flip(2)) for i in range(32)]
    kept = [torch.equal(out[i], plain[i]) for i in range(32)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 4 < sum(flipped) < 28
    # With padding, every output is a 32x32 window of the zero-padded image (maybe mirrored).
    aug = Augmenter(torch.device("cpu"), augment=True, seed=0, pad=4)
    crops = aug.draw(32, epoch=0, step=0, rank=0)
    assert crops is not None
    out = aug.apply(x, crops)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(32):
        r, c, f = (int(v) for v in crops[:, i])
        window = padded[i : i + 1, :, r : r + 32, c : c + 32]
        window = window.flip(3) if f else window
        assert torch.equal(out[i : i + 1], aug.normalize(window))


@pytest.mark.parametrize("name", ["resnet", "tinycnn"])
def test_models_and_stage_split(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, width=8).eval()
    x = torch.randn(4, 3, 32, 32)
    ref = model(x)
    assert ref.shape == (4, 10)
    for n in (1, 2, 3, 4, 99):
        stages = split_stages(model, n)
        assert 1 <= len(stages) <= n
        y = x
        for s in stages:
            y = s(y)
        assert torch.equal(y, ref)
    assert all(
        not isinstance(m, torch.nn.BatchNorm2d) for m in build_model(name, norm="none").modules()
    )


def test_draw_epoch_matches_the_per_step_draws() -> None:
    """The trainer's one-copy-per-epoch draws are exactly the per-step ones (resume stays exact)."""
    aug = Augmenter(torch.device("cpu"), augment=True, seed=3)
    epoch = aug.draw_epoch(12, 5, epoch=2, rank=1)
    assert epoch is not None and epoch.shape == (5, 3, 12)
    for s in range(5):
        assert torch.equal(epoch[s], aug.draw(12, epoch=2, step=s, rank=1))
    assert (
        Augmenter(torch.device("cpu"), augment=False, seed=3).draw_epoch(12, 5, epoch=0, rank=0)
        is None
    )


def test_the_reported_accuracy_says_what_data_it_is_on() -> None:
    synthetic = describe_data(DataConfig())
    assert "SYNTHETIC" in synthetic and "not CIFAR-10" in synthetic
    assert "train.data.kind=cifar10" in synthetic and "cifar-10-batches-bin" in synthetic
    real = describe_data(DataConfig(kind="cifar10", path="/data/cifar-10-batches-py"))
    assert real == "the CIFAR-10 test set (/data/cifar-10-batches-py)"
