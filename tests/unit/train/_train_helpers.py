"""Helpers for the train tests: run_training in N gloo processes on 127.0.0.1 (spawned)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from train.env import DistEnv
from train.loop.trainer import TrainResult, run_training
from train.spec.config import TrainConfig
from train.stop.signals import PreemptionGuard


class StopAtStep(PreemptionGuard):
    """A guard whose rank ``rank`` 'receives' USR2 right before the ``n``-th step boundary."""

    def __init__(self, n: int, rank: int = 0, my_rank: int = 0) -> None:
        super().__init__(("USR2",))
        self.n, self.rank, self.my_rank, self.calls = n, rank, my_rank, 0

    def should_stop(self, all_reduce_max: Callable[[int], int]) -> bool:
        self.calls += 1
        if self.calls == self.n and self.my_rank == self.rank:
            self.trigger("USR2")
        return super().should_stop(all_reduce_max)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _summary(result: TrainResult) -> dict[str, Any]:
    return {
        "steps": result.steps,
        "exit_code": result.exit_code,
        "stopped": result.stopped,
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "test_accuracy": result.test_accuracy,
    }


def _worker(rank: int, world: int, port: int, cfg_json: str, run_dir: str, opts: dict) -> None:
    cfg = TrainConfig.model_validate_json(cfg_json)
    env = DistEnv.from_env(torchrun_env(rank, world, port))
    guard = None
    if opts.get("stop_at"):
        guard = StopAtStep(opts["stop_at"], opts.get("stop_rank", 0), rank)
    result = run_training(
        cfg, env, Path(run_dir), opts.get("max_steps"), resume=opts.get("resume"), guard=guard
    )
    Path(run_dir, f"result-{rank}.json").write_text(json.dumps(_summary(result)))


def run_ranks(cfg: TrainConfig, run_dir: Path, world: int = 2, **opts: Any) -> list[dict[str, Any]]:
    """run_training on ``world`` spawned processes; returns each rank's summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(
        _worker,
        args=(world, free_port(), cfg.model_dump_json(by_alias=False), str(run_dir), opts),
        nprocs=world,
        join=True,
    )
    return [json.loads((run_dir / f"result-{r}.json").read_text()) for r in range(world)]


def final_params(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The model state stored in a checkpoint directory."""
    shared = torch.load(Path(checkpoint) / "shared.pt", weights_only=True)
    return dict(shared["model"])


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())
