"""How long a checkpoint save blocks training: plain torch.save vs sync vs async manager saves.

For the bench scripts::

    from bench.ckpt_helpers import bench_checkpoint_save
    result = bench_checkpoint_save(model, optimizer, "/tmp/bench-ckpt", repeats=5)
    # {"torch_save_s": ..., "sync_s": ..., "async_blocking_s": ..., "async_total_s": ...,
    #  "bytes": ..., "repeats": 5}

Each number is the median over ``repeats`` saves of the same state, single process (rank 0 of
1), by one synchronous and one asynchronous manager kept for all rounds (as a run keeps one:
the asynchronous one reuses its host buffers from the previous save). ``sync_s``: the
manager's atomic save (files hashed while written + fsync + manifest with model digest +
rename); ``async_blocking_s``: the part an asynchronous save spends on the training path (the
copy into host buffers); ``async_total_s``: until the background write is complete;
``torch_save_s``: one ``torch.save`` of the same state to one file, no fsync (the baseline
people compare to). :class:`CheckpointBench` gives one round at a time (``bench/bench_ckpt.py``
interleaves its rounds with a plain write of the same bytes).
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

__all__ = ["CheckpointBench", "bench_checkpoint_save"]


class CheckpointBench:
    """Rounds of the four measurements on one state; :meth:`close` removes everything."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, workdir: Path
    ) -> None:
        self.model = model
        self.root = Path(workdir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared: dict[str, Any] = {"optimizer": optimizer.state_dict() if optimizer else {}}
        self.rank_state = {"rng": capture_rng_state()}
        self.managers = {
            mode: CheckpointManager(
                self.root / mode, rank=0, world_size=1, keep_last=1, async_save=mode == "async"
            )
            for mode in ("sync", "async")
        }
        self.step = 0

    def round(self) -> dict[str, Any]:
        """One round: torch.save, a synchronous save, an asynchronous save (seconds, bytes)."""
        out: dict[str, Any] = {}
        plain = self.root / "plain.pt"
        t0 = time.perf_counter()
        torch.save(
            {"model": model_state_dict(self.model), **self.shared, "rank": self.rank_state}, plain
        )
        out["torch_save_s"] = time.perf_counter() - t0
        out["bytes"] = plain.stat().st_size
        plain.unlink()
        self.step += 1
        for mode, cm in self.managers.items():
            t0 = time.perf_counter()
            cm.save(
                self.step,
                self.shared,
                self.rank_state,
                epoch=0,
                epoch_step=self.step,
                model=self.model,
            )
            t1 = time.perf_counter()
            cm.wait()  # async: until written; both: the pruned previous round deleted
            t2 = time.perf_counter()
            if mode == "sync":
                out["sync_s"] = t1 - t0
            else:
                out["async_blocking_s"] = t1 - t0
                out["async_total_s"] = t2 - t0
        return out

    def close(self) -> None:
        for cm in self.managers.values():
            cm.close()
        shutil.rmtree(self.root, ignore_errors=True)


def bench_checkpoint_save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    workdir: str | os.PathLike[str],
    *,
    repeats: int = 5,
) -> dict[str, Any]:
    """Median save times (seconds) of the same state four ways; see the module docstring.

    One unmeasured round first (allocations, the asynchronous manager's host buffers).
    ``workdir`` is left as it was found (its ``bench`` subdirectory is removed)."""
    bench = CheckpointBench(model, optimizer, Path(workdir) / "bench")
    try:
        bench.round()
        rounds = [bench.round() for _ in range(repeats)]
    finally:
        bench.close()
    keys = ("torch_save_s", "sync_s", "async_blocking_s", "async_total_s")
    result: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in keys}
    result["bytes"] = rounds[-1]["bytes"]
    result["repeats"] = repeats
    return result
