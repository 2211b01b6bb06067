"""Checkpoints: how long a save blocks training, and how fast it writes, against plain baselines.

Uses :class:`bench.ckpt_helpers.CheckpointBench` (train's own measurement of one state saved four
ways, by one synchronous and one asynchronous manager kept across rounds as a run keeps them)
once per round, alternating with a plain write of the same number of bytes, so every number
below comes from the same rounds:

- blocking time of a synchronous :class:`train.checkpoint.manager.CheckpointManager` save (files
hashed
  while written, fsync, manifest with the model digest computed beside the writes, atomic
  rename) and of an asynchronous one (copy-on-write: only the state's structure is built on the
  training path) against one ``torch.save`` of the same state (one file, no fsync); goal
  <= 0.05x;
- write speed: bytes of that state over the synchronous save's time against a plain
  ``write`` + ``fsync`` of the same number of bytes; goal >= 0.8x.

The state is a ResNet-9 (width 64, the original 6.5M parameters) with SGD momentum buffers,
about 50 MB: large enough that writing, not Python overhead, dominates.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, Goal, Options, interleave

__all__ = ["plain_write", "run"]

SECTION = "Checkpoints"


def plain_write(path: Path, nbytes: int, chunk: int = 1 << 22) -> float:
    """Seconds to write ``nbytes`` to a new file and fsync it (the disk's plain speed)."""
    block = os.urandom(min(chunk, max(nbytes, 1)))
    t0 = time.perf_counter()
    with path.open("wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def _state(width: int) -> tuple[Any, Any]:
    import torch
    from torch import nn

    from train.loop.models import build_model

    torch.manual_seed(0)
    model = build_model("resnet", width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(4, 3, 32, 32)
    nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()  # creates the momentum buffers a real checkpoint carries
    return model, opt


def run(opts: Options) -> list[Figure]:
    """Sync/async blocking time vs torch.save, and write speed vs a plain write."""
    from bench.ckpt_helpers import CheckpointBench

    width = 32 if opts.quick else 64
    repeats = 3 if opts.quick else 5
    workdir = opts.workdir / "ckpt"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    model, opt = _state(width)
    opts.log(f"ckpt: resnet w{width}, {repeats} rounds")
    bench = CheckpointBench(model, opt, workdir / "mgr")
    rounds: list[dict[str, Any]] = []
    try:
        rounds.append(bench.round())  # the size of the state, before any plain write

        def manager() -> float:
            rounds.append(bench.round())
            return float(rounds[-1]["sync_s"])

        def plain() -> float:
            return plain_write(workdir / "plain.bin", int(rounds[0]["bytes"]))

        samples = interleave({"manager": manager, "plain": plain}, repeats=repeats, warmup=1)
    finally:
        bench.close()
    kept = rounds[-repeats:]
    torch_save = [float(r["torch_save_s"]) for r in kept]
    sync = [float(r["sync_s"]) for r in kept]
    async_block = [float(r["async_blocking_s"]) for r in kept]
    async_total = [float(r["async_total_s"]) for r in kept]
    nbytes = int(rounds[0]["bytes"])
    mb = nbytes / 1e6
    note = f"resnet w{width} + SGD momentum, {mb:.1f} MB, median of {repeats}"
    shutil.rmtree(workdir, ignore_errors=True)
    return [
        Figure.measured(
            SECTION,
            "blocking time, synchronous save",
            "s",
            sync,
            torch_save,
            baseline_name="torch.save",
            note=f"{note}; includes fsync, digest, manifest, rename (torch.save: none)",
        ),
        Figure.measured(
            SECTION,
            "blocking time, asynchronous save",
            "s",
            async_block,
            torch_save,
            baseline_name="torch.save",
            note=f"{note}; copy-on-write: the background thread copies, the next forward/step "
            "waits for it",
            goal=Goal("<=", 0.05),
        ),
        Figure.measured(
            SECTION,
            "asynchronous save, until written",
            "s",
            async_total,
            torch_save,
            baseline_name="torch.save",
            note="background thread; the next save waits for it",
        ),
        Figure.measured(
            SECTION,
            "write speed, synchronous save",
            "MB/s",
            [mb / s for s in samples["manager"]],
            [mb / s for s in samples["plain"]],
            baseline_name="write+fsync of the same bytes",
            note=f"{note}; xxh3-128 of the files (inline) and of the model; disk writeback started "
            "every 8 MiB while writing (sync_file_range), one fsync at the end",
            goal=Goal(">=", 0.8),
        ),
    ]
