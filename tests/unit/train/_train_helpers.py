"""Helpers for the train tests: run_training in N gloo processes on 127.0.0.1.

Ranks are forked from multiprocessing's fork server, which imports torch and the trainer once
per test worker (:func:`start_ranks`): a rank then starts in milliseconds, where a fresh
interpreter pays about 1.5-2 s of CPU to import them (the multi-rank tests start about a
hundred ranks; on a 2-core machine that import was most of the unit suite's CPU time). Each rank
is still its own process with its own process group, and gets exactly the environment the
test gives it (the fork server's own environment is not inherited).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
from collections.abc import Callable, Mapping
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


#: What the fork server imports once, so that no rank imports it again.
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    # torch.use_deterministic_algorithms imports torch._inductor.config (and with it
    # torch._dynamo: 2-2.4 s of a forked rank's 3.7 s start, profiled); DDP imports torch._dynamo
    "torch._dynamo",
    "torch._inductor.config",
    "train.loop.trainer",
    "train.session",
    "_train_helpers",
]


def _with_environ(
    rank: int, environ: Mapping[str, str], fn: Callable[..., Any], *args: Any
) -> None:
    os.environ.clear()
    os.environ.update(environ)
    fn(rank, *args)


def start_ranks(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    nprocs: int,
    environ: Mapping[str, str] | None = None,
) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes forked from the fork server (see the module
    docstring), each with ``environ`` (default: this process's environment now) as its
    ``os.environ``; waits for all, and raises if one of them failed (torch.multiprocessing)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(
        _with_environ,
        args=(dict(os.environ if environ is None else environ), fn, *args),
        nprocs=nprocs,
        join=True,
        start_method="forkserver",
    )


def run_ranks(cfg: TrainConfig, run_dir: Path, world: int = 2, **opts: Any) -> list[dict[str, Any]]:
    """run_training on ``world`` processes (:func:`start_ranks`); returns each rank's summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start_ranks(
        _worker,
        (world, free_port(), cfg.model_dump_json(by_alias=False), str(run_dir), opts),
        world,
    )
    return [json.loads((run_dir / f"result-{r}.json").read_text()) for r in range(world)]


def final_params(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The model state stored in a checkpoint directory."""
    shared = torch.load(Path(checkpoint) / "shared.pt", weights_only=True)
    return dict(shared["model"])


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def stop_after_worker(
    rank: int, cfg_json: str, run_dir: str, stop_after: int, stop_rank: int, resume: bool,
    min_step_s: float,
) -> None:  # fmt: skip
    """Rank ``rank`` of a torchrun-style run (WORLD_SIZE, MASTER_* in ``os.environ``; RANK and
    LOCAL_RANK set here): rank ``stop_rank`` 'receives' USR2 at its ``stop_after``-th stop check
    (0: never); a step takes at least ``min_step_s`` (a test that needs the floor says why).
    Writes ``result-RANK.json``."""
    import time

    from train.loop import trainer

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))

    if min_step_s > 0:
        step_once = trainer._Loop.train_step

        def slow_step(self: Any, order: Any) -> None:
            time.sleep(min_step_s)
            step_once(self, order)

        trainer._Loop.train_step = slow_step  # type: ignore[method-assign]
    env = DistEnv.from_env(os.environ)
    guard = StopAtStep(stop_after, stop_rank, env.rank) if stop_after > 0 else None
    result = run_training(
        TrainConfig.model_validate_json(cfg_json), env, Path(run_dir), guard=guard,
        resume=True if resume else None,
    )  # fmt: skip
    out = {
        "rank": env.rank,
        "steps": result.steps,
        "exit_code": result.exit_code,
        "resumed_from": str(result.resumed_from) if result.resumed_from else None,
    }
    Path(run_dir, f"result-{env.rank}.json").write_text(json.dumps(out))
