"""Spawned ranks for the resume-on-another-shape tests: run_training on ``world`` gloo processes,
each recording the training-set indices it computed per step (train.loop.trainer.BATCH_HOOKS)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from _train_helpers import StopAtStep, free_port, start_ranks, torchrun_env

from train.env import DistEnv
from train.loop import trainer
from train.loop.trainer import run_training
from train.spec.config import TrainConfig


def _worker(rank: int, world: int, port: int, cfg_json: str, run_dir: str, opts: dict) -> None:
    seen: list[tuple[int, int, list[int]]] = []

    def record(step: int, epoch: int, indices: torch.Tensor) -> None:
        seen.append((step, epoch, indices.tolist()))

    trainer.BATCH_HOOKS.append(record)
    cfg = TrainConfig.model_validate_json(cfg_json)
    env = DistEnv.from_env(torchrun_env(rank, world, port))
    guard = StopAtStep(opts["stop_at"], 0, rank) if opts.get("stop_at") else None
    result = run_training(cfg, env, Path(run_dir), resume=opts.get("resume"), guard=guard)
    out = {"steps": result.steps, "exit_code": result.exit_code, "seen": seen}
    Path(run_dir, f"attempt-{opts['attempt']}-rank-{rank}.json").write_text(json.dumps(out))


def run_attempt(
    cfg: TrainConfig, run_dir: Path, world: int, attempt: int, **opts: Any
) -> list[dict[str, Any]]:
    """One attempt of a run on ``world`` ranks; each rank's steps, exit code and samples."""
    run_dir.mkdir(parents=True, exist_ok=True)
    opts = {**opts, "attempt": attempt}
    start_ranks(
        _worker,
        (world, free_port(), cfg.model_dump_json(by_alias=False), str(run_dir), opts),
        world,
    )
    return [
        json.loads((run_dir / f"attempt-{attempt}-rank-{r}.json").read_text()) for r in range(world)
    ]


def global_batches(attempts: list[list[dict[str, Any]]]) -> dict[int, list[int]]:
    """Step -> the sorted sample ids all ranks of all attempts computed at that step; a step
    computed by two attempts fails (a repeated global batch)."""
    out: dict[int, list[int]] = {}
    for ranks in attempts:
        steps: dict[int, list[int]] = {}
        for rank in ranks:
            for step, _epoch, ids in rank["seen"]:
                steps.setdefault(step, []).extend(ids)
        for step, ids in steps.items():
            assert step not in out, f"step {step} was computed twice"
            out[step] = sorted(ids)
    return out


def stopping_reshard_main(ctx: Any) -> int:
    """examples.reshard_train:main whose rank 0 'receives' the stop signal at the 4th check
    when TEST_STOP_AT is set (a test's stand-in for a preemption)."""
    import os

    from examples import reshard_train

    if os.environ.get("TEST_STOP_AT"):
        guard, calls = ctx.guard, [0]
        should_stop = guard.should_stop

        def stop_at(reduce: Any) -> bool:
            calls[0] += 1
            if calls[0] == int(os.environ["TEST_STOP_AT"]) and ctx.env.rank == 0:
                guard.trigger("USR2")
            return bool(should_stop(reduce))

        guard.should_stop = stop_at
    return int(reshard_train.main(ctx))


def _entry_worker(rank: int, world: int, port: int, spec: dict, run_dir: str, opts: dict) -> None:
    import os

    from train.entry import run_entrypoint
    from train.spec.config import RunConfig

    os.environ.pop("TEST_STOP_AT", None)
    if opts.get("stop_at"):
        os.environ["TEST_STOP_AT"] = str(opts["stop_at"])
    env = DistEnv.from_env(torchrun_env(rank, world, port))
    code = run_entrypoint(RunConfig.model_validate(spec), env, Path(run_dir), opts.get("resume"))
    Path(run_dir, f"entry-{opts['attempt']}-rank-{rank}.json").write_text(json.dumps(code))


def run_entry_attempt(spec: dict, run_dir: Path, world: int, attempt: int, **opts: Any) -> list:
    """One attempt of an entrypoint.function run on ``world`` ranks; each rank's exit code."""
    run_dir.mkdir(parents=True, exist_ok=True)
    opts = {**opts, "attempt": attempt}
    start_ranks(_entry_worker, (world, free_port(), spec, str(run_dir), opts), world)
    return [
        json.loads((run_dir / f"entry-{attempt}-rank-{r}.json").read_text()) for r in range(world)
    ]
