"""CIFAR-10 in memory: the on-disk readers/writer, a learnable synthetic set, batches, augmentation.

Images stay uint8 tensors ``[N, 3, 32, 32]`` (on the training device when it is a GPU) and a batch
is one index operation, so data loading is never the bottleneck and needs no worker processes.

- ``read_cifar10(path)``: the binary version (``data_batch_1.bin``..``test_batch.bin``, records of
  1 label byte + 3072 pixel bytes) or the python version (pickled dicts with ``b"data"`` and
  ``b"labels"``; unpickled with an allow-list, never arbitrary objects).
- ``make_synthetic(...)``: class-dependent smooth colour patterns + per-image noise and shifts; a
  small CNN gets well above chance within a few hundred CPU steps. ``write_cifar10`` stores any set
  in either on-disk format, so tests exercise the real readers.
- ``Augmenter``: random crop with 4-pixel zero padding + horizontal flip, on tensors, driven by one
  ``torch.Generator`` re-seeded from (seed, epoch, step, rank): resume is exact and the global RNG
  is never touched.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from train.errors import DataError
from train.spec import DataConfig

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "Augmenter",
    "ImageSet",
    "describe_data",
    "load_data",
    "make_synthetic",
    "read_cifar10",
    "write_cifar10",
]

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
NUM_CLASSES = 10
_RECORD = 1 + 3 * 32 * 32
_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
_TEST_FILE = "test_batch"


@dataclass(frozen=True)
class ImageSet:
    """Images ``uint8 [N, 3, 32, 32]`` and labels ``int64 [N]``."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device) -> ImageSet:
        """The same set on ``device`` (a GPU holds all of CIFAR-10 in ~180 MB)."""
        return ImageSet(self.images.to(device), self.labels.to(device))


# ---------------------------------------------------------------------------------------- readers


def _read_binary(path: Path) -> ImageSet:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _RECORD != 0:
        raise DataError(
            f"{path}: size {raw.size} bytes is not a multiple of the {_RECORD}-byte CIFAR-10 record"
        )
    rec = raw.reshape(-1, _RECORD)
    labels = rec[:, 0].astype(np.int64)
    if labels.max() >= NUM_CLASSES:
        raise DataError(f"{path}: label {labels.max()} out of range 0..9 (not CIFAR-10 binary?)")
    images = np.ascontiguousarray(rec[:, 1:]).reshape(-1, 3, 32, 32)
    return ImageSet(torch.from_numpy(images), torch.from_numpy(labels))


class _SafeUnpickler(pickle.Unpickler):
    """Only what a CIFAR pickle needs (numpy arrays, plain containers): no code execution."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _read_pickle(path: Path) -> ImageSet:
    try:
        with path.open("rb") as f:
            obj = _SafeUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch: {exc}") from exc
    if not isinstance(obj, dict) or b"data" not in obj or b"labels" not in obj:
        raise DataError(f"{path}: expected a dict with b'data' and b'labels'")
    data = np.asarray(obj[b"data"], dtype=np.uint8)
    labels = np.asarray(obj[b"labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{path}: data shape {data.shape} / {labels.shape[0]} labels do not match")
    images = np.ascontiguousarray(data).reshape(-1, 3, 32, 32)
    return ImageSet(torch.from_numpy(images), torch.from_numpy(labels))


def _concat(sets: list[ImageSet]) -> ImageSet:
    return ImageSet(torch.cat([s.images for s in sets]), torch.cat([s.labels for s in sets]))


def read_cifar10(path: str | Path) -> tuple[ImageSet, ImageSet]:
    """Read (train, test) from a directory in the binary or python CIFAR-10 format.

    ``path`` may be the directory holding the batch files or its parent (``cifar-10-batches-bin``
    / ``cifar-10-batches-py`` inside it).
    """
    root = Path(path).expanduser()
    for cand in (root, root / "cifar-10-batches-bin", root / "cifar-10-batches-py"):
        if (cand / "data_batch_1.bin").is_file():
            files = [cand / f"{n}.bin" for n in _TRAIN_FILES]
            reader = _read_binary
            test = cand / f"{_TEST_FILE}.bin"
            break
        if (cand / "data_batch_1").is_file():
            files = [cand / n for n in _TRAIN_FILES]
            reader = _read_pickle
            test = cand / _TEST_FILE
            break
    else:
        raise DataError(
            f"{root}: no CIFAR-10 data (data_batch_1.bin.. or data_batch_1..) found; set "
            "train.data.path to the extracted cifar-10-batches-bin or -py directory, or use "
            "train.data.kind: synthetic"
        )
    missing = [str(f) for f in [*files, test] if not f.is_file()]
    if missing:
        raise DataError(f"CIFAR-10 files missing: {', '.join(missing)}")
    return _concat([reader(f) for f in files]), reader(test)


def write_cifar10(path: str | Path, train: ImageSet, test: ImageSet, fmt: str = "binary") -> Path:
    """Write (train, test) in the standard layout: 5 train batches + test batch. Returns the dir."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    chunks = torch.arange(len(train)).tensor_split(len(_TRAIN_FILES))
    parts = [
        (n, ImageSet(train.images[c], train.labels[c]))
        for n, c in zip(_TRAIN_FILES, chunks, strict=True)
    ]
    parts.append((_TEST_FILE, test))
    for name, part in parts:
        images = part.images.cpu().numpy().reshape(len(part), -1)
        labels = part.labels.cpu().numpy().astype(np.uint8)
        if fmt == "binary":
            rec = np.concatenate([labels[:, None], images], axis=1)
            tmp = out / f".{name}.bin.tmp"
            rec.tofile(tmp)
            tmp.replace(out / f"{name}.bin")
        elif fmt == "python":
            obj = {
                b"batch_label": name.encode(),
                b"labels": [int(v) for v in labels],
                b"data": images,
                b"filenames": [f"{name}_{i}.png".encode() for i in range(len(part))],
            }
            tmp = out / f".{name}.tmp"
            with tmp.open("wb") as f:
                pickle.dump(obj, f, protocol=2)
            tmp.replace(out / name)
        else:
            raise ValueError(f"unknown CIFAR-10 format {fmt!r}: use 'binary' or 'python'")
    return out


# -------------------------------------------------------------------------------------- synthetic


def _templates(seed: int) -> torch.Tensor:
    """One smooth colour pattern per class, ``float [10, 3, 32, 32]`` in about [-1, 1]."""
    gen = torch.Generator().manual_seed(10_007 + seed)
    coarse = torch.randn(NUM_CLASSES, 3, 4, 4, generator=gen)
    smooth = F.interpolate(coarse, size=(32, 32), mode="bicubic", align_corners=False)
    return smooth / smooth.abs().amax(dim=(1, 2, 3), keepdim=True)


def make_synthetic(n: int, *, seed: int, split: str, noise: float = 0.5) -> ImageSet:
    """A deterministic, learnable CIFAR-shaped set (same templates for train and test splits).

    Each image is its class's pattern, shifted by up to 3 pixels, with random contrast and
    brightness, plus Gaussian noise of std ``noise`` (relative to the pattern's amplitude).
    """
    split_id = {"train": 1, "test": 2}[split]
    gen = torch.Generator().manual_seed(seed * 1000 + split_id)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    # 7x7 shifted copies of each template: indexing them is a per-image shift without a loop.
    templates = _templates(seed)
    shifted = torch.stack(
        [
            torch.roll(templates, shifts=(dy, dx), dims=(2, 3))
            for dy in range(-3, 4)
            for dx in range(-3, 4)
        ],
        dim=1,
    )  # [10, 49, 3, 32, 32]
    shift = torch.randint(0, 49, (n,), generator=gen)
    base = shifted[labels, shift]
    contrast = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=gen)
    bright = 0.3 * torch.randn(n, 1, 1, 1, generator=gen)
    img = contrast * base + bright + noise * torch.randn(n, 3, 32, 32, generator=gen)
    pixels = (128.0 + 60.0 * img).round().clamp(0, 255).to(torch.uint8)
    return ImageSet(pixels.contiguous(), labels.to(torch.int64))


def load_data(config: DataConfig, seed: int) -> tuple[ImageSet, ImageSet]:
    """The (train, test) sets the spec asks for, on the CPU.

    Synthetic data with ``path`` set is written there in the binary format (once) and read back,
    so runs use the same reader as real CIFAR-10.
    """
    if config.kind == "cifar10":
        assert config.path is not None  # guaranteed by DataConfig's validator
        return read_cifar10(config.path)
    train = make_synthetic(config.train_size, seed=seed, split="train", noise=config.noise)
    test = make_synthetic(config.test_size, seed=seed, split="test", noise=config.noise)
    if config.path:
        target = Path(config.path)
        if not (target / "test_batch.bin").is_file():
            write_cifar10(target, train, test, fmt="binary")
        return read_cifar10(target)
    return train, test


def describe_data(config: DataConfig) -> str:
    """What a test accuracy was measured on, for the line that reports it.

    Synthetic data says so next to the number (the example's 99% is not a CIFAR-10 result) and
    how to get the real thing.
    """
    if config.kind == "cifar10":
        return f"the CIFAR-10 test set ({config.path})"
    return (
        "SYNTHETIC data, not CIFAR-10 (for real CIFAR-10 set train.data.kind=cifar10 and "
        "train.data.path=DIR/cifar-10-batches-bin; README: Real CIFAR-10)"
    )


# ------------------------------------------------------------------------------------ augmentation


class Augmenter:
    """Normalise a uint8 batch and (optionally) random-crop + flip it, deterministically.

    The one ``torch.Generator`` is re-seeded per step from (seed, epoch, step, rank),
    so a resumed run draws exactly the same crops, and no generator is allocated per step.
    """

    def __init__(self, device: torch.device, *, augment: bool, seed: int, pad: int = 4) -> None:
        self.device = device
        self.augment = augment
        self.seed = seed
        self.pad = pad
        mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
        # x/255 then (x - mean)/std folded into one multiply-add.
        self._scale = 1.0 / (255.0 * std)
        self._shift = -mean / std
        self._gen = torch.Generator(device="cpu")
        self._arange = torch.arange(32, device=device)
        self._chans = torch.arange(3, device=device)[None, :, None, None]

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 -> normalised float32."""
        return torch.addcmul(self._shift, images.float(), self._scale)

    def draw(self, n: int, *, epoch: int, step: int, rank: int) -> torch.Tensor | None:
        """Crop offsets and flips for the ``n`` images of one optimizer step on one rank.

        Drawn once per step (for all its micro-batches) so splitting a step into micro-batches
        does not change the augmentation. Returns ``int64 [3, n]`` (row, col, flip) on the
        device, or None when augmentation is off.
        """
        if not self.augment:
            return None
        return self._draw_cpu(n, epoch, step, rank).to(self.device, non_blocking=True)

    def draw_epoch(self, n: int, steps: int, *, epoch: int, rank: int) -> torch.Tensor | None:
        """``draw`` for every step of an epoch at once: ``int64 [steps, 3, n]`` on the device.

        Step ``s`` of the result equals ``draw(n, epoch=epoch, step=s, rank=rank)``; the trainer
        copies one tensor per epoch instead of one per step (no per-step host-to-device copy).
        """
        if not self.augment:
            return None
        out = torch.empty((steps, 3, n), dtype=torch.long)
        for s in range(steps):
            out[s] = self._draw_cpu(n, epoch, s, rank)
        return out.to(self.device, non_blocking=True)

    def _draw_cpu(self, n: int, epoch: int, step: int, rank: int) -> torch.Tensor:
        key = ((self.seed * 1_000_003 + epoch) * 1_000_003 + step) * 1_009 + rank
        self._gen.manual_seed(key % (2**63 - 1))
        # Drawn on the CPU (a few hundred bytes) so the stream is the same on every device type.
        offsets = torch.randint(0, 2 * self.pad + 1, (2, n), generator=self._gen)
        flips = (torch.rand(n, generator=self._gen) < 0.5).long()
        return torch.cat([offsets, flips[None]])

    def apply(
        self, images: torch.Tensor, crops: torch.Tensor | None, start: int = 0
    ) -> torch.Tensor:
        """Crop/flip ``images`` with ``crops[:, start:start + len(images)]``, then normalise.

        The pixel work runs on the images' device, on uint8 (zero padding = a black border, as
        torchvision's ``RandomCrop(32, padding=4)``).
        """
        if crops is None:
            return self.normalize(images)
        n = images.shape[0]
        c = crops[:, start : start + n]
        padded = F.pad(images, (self.pad, self.pad, self.pad, self.pad))
        rows = (c[0][:, None] + self._arange)[:, None, :, None]
        cols = c[1][:, None] + self._arange
        cols = torch.where(c[2][:, None].bool(), cols.flip(1), cols)[:, None, None, :]
        batch = torch.arange(n, device=images.device)[:, None, None, None]
        return self.normalize(padded[batch, self._chans, rows, cols])

    def __call__(self, images: torch.Tensor, *, epoch: int, step: int, rank: int) -> torch.Tensor:
        """Augment + normalise one batch (draw and apply in one call)."""
        crops = self.draw(images.shape[0], epoch=epoch, step=step, rank=rank)
        return self.apply(images, crops)
