"""Metrics kept on the device, reduced across ranks at log intervals, written by rank 0 only.

- :class:`StepMeter` accumulates loss sums and correct counts as device tensors (no host sync per
  step); :meth:`StepMeter.reduce` all-reduces them once per log interval.
- :class:`MetricsWriter` appends JSON lines to ``RUN_DIR/metrics.jsonl`` when ``is_main``.
- :class:`StepTimer` times training steps only; :func:`evaluate` runs the held-out set.
- :func:`setup_logging` (:mod:`train.logsetup`, torch-free) prefixes every log line with the
  rank and also writes ``RUN_DIR/logs/rank-R.log``; :func:`progress_line` is rank 0's line.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from torch import nn

from train.env import DistEnv
from train.loop.data import Augmenter, ImageSet
from train.runfiles import METRICS_FILE, open_text

__all__ = [
    "MetricsWriter",
    "StepMeter",
    "StepTimer",
    "evaluate",
    "progress_line",
    "reduce_sums",
]


def reduce_sums(values: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-reduce (SUM) a 1-D tensor when a process group exists; identity otherwise."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    return values


class StepMeter:
    """Loss and accuracy accumulated on ``device`` between log points."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss*n, correct
        self._count = 0

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one micro-batch: ``loss`` is its mean loss (detached), logits/labels its outputs."""
        n = labels.shape[0]
        correct = (logits.argmax(dim=1) == labels).sum()
        self._sums += torch.stack([loss.double() * n, correct.double()])
        self._count += n

    def reduce(self) -> dict[str, float]:
        """Mean loss and accuracy over all ranks since the last call (one host sync); resets."""
        packed = torch.cat(
            [
                self._sums,
                torch.tensor([float(self._count)], dtype=torch.float64, device=self.device),
            ]
        )
        loss_sum, correct, count = reduce_sums(packed).tolist()
        self._sums.zero_()
        self._count = 0
        if count == 0:
            return {"loss": math.nan, "accuracy": math.nan, "samples": 0}
        return {"loss": loss_sum / count, "accuracy": correct / count, "samples": int(count)}


class MetricsWriter:
    """Appends one JSON object per line to ``RUN_DIR/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, run_dir: Path, is_main: bool) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.is_main = is_main
        self.records: list[dict[str, Any]] = []
        self._file: IO[str] | None = None
        if is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open_text(self.path, "a")

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Record ``fields`` (kept in :attr:`records` on every rank, written on rank 0)."""
        record = {"time": round(time.time(), 3), "kind": kind, **fields}
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record, allow_nan=True) + "\n")
            self._file.flush()
        return record

    def close(self) -> None:
        """Close the file (rank 0)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def progress_line(record: dict[str, Any], total_steps: int) -> str:
    """``step 120/500 (24%) epoch 2 | loss 1.234 acc 55.1% | lr 0.0800 | 3120 img/s``."""
    parts = [f"step {record['step']}/{total_steps} ({100 * record['step'] / total_steps:.0f}%)"]
    parts[0] += f" epoch {record['epoch']}"
    if record.get("kind") == "eval":
        parts.append(
            f"test loss {record['test_loss']:.4f} test acc {100 * record['test_accuracy']:.2f}%"
        )
        return " | ".join(parts)
    parts.append(f"loss {record['loss']:.4f} acc {100 * record['accuracy']:.1f}%")
    parts.append(f"lr {record['lr']:.5f}")
    if record.get("images_per_s") is not None:
        parts.append(f"{record['images_per_s']:.0f} img/s")
    return " | ".join(parts)


class StepTimer:
    """Wall time of training steps only (eval/checkpoint paused); synchronises CUDA at edges."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self.images = 0
        self.armed = False
        self._start: float | None = None

    def start(self) -> None:
        if self.armed and self._start is None:
            if self.cuda:
                torch.cuda.synchronize()
            self._start = time.perf_counter()

    def pause(self) -> None:
        if self._start is not None:
            if self.cuda:
                torch.cuda.synchronize()
            self.total += time.perf_counter() - self._start
            self._start = None

    def count(self, images: int) -> None:
        if self._start is not None:
            self.images += images

    @property
    def images_per_s(self) -> float | None:
        return self.images / self.total if self.total > 0 and self.images else None


@torch.no_grad()
def evaluate(
    module: nn.Module,
    test: ImageSet,
    aug: Augmenter,
    env: DistEnv,
    batch: int,
    out_device: torch.device,
    waiting: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[float, float]:
    """Mean loss and accuracy on held-out data, sharded over ranks (``rank::world``).
    ``waiting``: around the all-reduce of the sums (waiting for the other ranks' shards)."""
    was_training = module.training
    module.train(False)
    sums = torch.zeros(3, dtype=torch.float64, device=out_device)
    shard = torch.arange(env.rank, len(test), env.world_size, device=test.images.device)
    for chunk in shard.split(batch):
        logits = module(aug.normalize(test.images[chunk])).float()
        y = test.labels[chunk].to(out_device, non_blocking=True)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum")
        correct = (logits.argmax(1) == y).sum()
        sums[0] += loss.double()
        sums[1] += correct.double()
        sums[2] += y.shape[0]
    module.train(was_training)
    with waiting():
        loss_sum, correct_sum, count = reduce_sums(sums).tolist()
    return loss_sum / max(count, 1.0), correct_sum / max(count, 1.0)
