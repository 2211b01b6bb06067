"""How long a checkpoint save blocks training: plain torch.save vs sync vs async manager saves.

For the bench scripts::

    from train.ckpt_bench import bench_checkpoint_save
    result = bench_checkpoint_save(model, optimizer, "/tmp/bench-ckpt", repeats=5)
    # {"torch_save_s": ..., "sync_s": ..., "async_blocking_s": ..., "async_total_s": ...,
    #  "bytes": ..., "repeats": 5}

Each number is the median over ``repeats`` saves of the same state, single process (rank 0 of
1). ``sync_s``: the manager's atomic save (files + fsync + manifest + digest + rename);
``async_blocking_s``: the part an asynchronous save spends on the training path (the CPU copy);
``async_total_s``: until the background write is complete; ``torch_save_s``: one
``torch.save`` of the same state to one file, no fsync (the baseline people compare to).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from train.checkpoint import CheckpointManager, capture_rng_state, model_state_dict

__all__ = ["bench_checkpoint_save"]


def bench_checkpoint_save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    workdir: str | os.PathLike[str],
    *,
    repeats: int = 5,
) -> dict[str, Any]:
    """Median save times (seconds) of the same state four ways; see the module docstring."""
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    shared: dict[str, Any] = {"optimizer": optimizer.state_dict() if optimizer else {}}
    rank_state = {"rng": capture_rng_state()}
    times: dict[str, list[float]] = {
        "torch_save_s": [],
        "sync_s": [],
        "async_blocking_s": [],
        "async_total_s": [],
    }
    size = 0
    for i in range(repeats):
        plain = root / f"plain-{i}.pt"
        t0 = time.perf_counter()
        torch.save({"model": model_state_dict(model), **shared, "rank": rank_state}, plain)
        times["torch_save_s"].append(time.perf_counter() - t0)
        size = plain.stat().st_size
        plain.unlink()
        for mode in ("sync", "async"):
            ckpt_root = root / f"{mode}-{i}"
            cm = CheckpointManager(
                ckpt_root, rank=0, world_size=1, keep_last=1, async_save=mode == "async"
            )
            t0 = time.perf_counter()
            cm.save(i + 1, shared, rank_state, epoch=0, epoch_step=i + 1, model=model)
            t1 = time.perf_counter()
            cm.wait()
            t2 = time.perf_counter()
            if mode == "sync":
                times["sync_s"].append(t1 - t0)
            else:
                times["async_blocking_s"].append(t1 - t0)
                times["async_total_s"].append(t2 - t0)
            shutil.rmtree(ckpt_root, ignore_errors=True)
    result: dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
    result["bytes"] = size
    result["repeats"] = repeats
    return result
