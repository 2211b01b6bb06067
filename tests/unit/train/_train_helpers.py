"""Helpers for the train tests: run_training in N gloo processes on 127.0.0.1.

Ranks are forked from multiprocessing's fork server, which imports torch and the trainer once
per test worker (:func:`start_ranks`): a rank then starts in milliseconds, where a fresh
interpreter pays about 1.5-2 s of CPU to import them (the multi-rank tests start about a
hundred ranks; on a 2-core machine that import was most of the unit suite's CPU time). Each rank
is still its own process with its own process group, and gets exactly the environment the
test gives it (the fork server's own environment is not inherited).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from train.env import DistEnv
from train.loop.optim import eager
from train.loop.strategies import eager_ddp
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


class InterruptAtStep(PreemptionGuard):
    """A guard that raises KeyboardInterrupt (a user's Ctrl-C) at the ``n``-th step boundary."""

    def __init__(self, n: int) -> None:
        super().__init__(("USR2",))
        self.n, self.calls = n, 0

    def should_stop(self, all_reduce_max: Callable[[int], int]) -> bool:
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
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
    if opts.get("interrupt_at"):  # every rank at once, as a Ctrl-C of the job would
        guard = InterruptAtStep(opts["interrupt_at"])
    destroyed_with: list[int] = []  # DDP modules alive when the default group was destroyed
    destroy = dist.destroy_process_group

    def counting(group: Any = None) -> None:
        if group is None:
            ddp = nn.parallel.DistributedDataParallel
            destroyed_with.append(sum(isinstance(o, ddp) for o in gc.get_objects()))
        destroy(group)

    dist.destroy_process_group = counting  # type: ignore[assignment]  # this rank's process
    try:
        result = run_training(
            cfg, env, Path(run_dir), opts.get("max_steps"), resume=opts.get("resume"), guard=guard
        )
    except KeyboardInterrupt:
        summary: dict[str, Any] = {"interrupted": True, "ddp_alive_at_destroy": destroyed_with}
    else:
        summary = {**_summary(result), "ddp_alive_at_destroy": destroyed_with}
    Path(run_dir, f"result-{rank}.json").write_text(json.dumps(summary))


#: What the fork server imports once, so that no rank imports it again.
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    # not torch._dynamo: the ranks train as a run does, without it (train.loop.strategies.eager_ddp,
    # train.loop.optim.eager, train.deterministic), and a test that imports it pays for it
    "train.loop.trainer",
    "train.session",
    "_train_helpers",
]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.relu(self.bn(self.a(x))))
        return out


def _train_ddp(ddp: nn.Module, model: nn.Module, rank: int) -> list[torch.Tensor]:
    opt = eager(torch.optim.SGD)(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        if step == 1:  # a non-final micro-step of gradient accumulation
            with ddp.no_sync():  # type: ignore[operator]
                ddp(torch.randn(5, 4, generator=g)).pow(2).sum().backward()
        ddp(torch.randn(5, 4, generator=g)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return [t.detach().clone() for t in model.state_dict().values()]


def eager_ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """The same training under :func:`train.loop.strategies.eager_ddp`, then torch's DDP; writes
    whether the first left the compiler unimported, the two agree bitwise, and the first's
    forward still runs (the same again) once the second has imported the compiler."""
    os.environ.update(torchrun_env(rank, world, port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    ours_model = _Net()
    ours = eager_ddp(ours_model)
    ours_params = _train_ddp(ours, ours_model, rank)
    compiler = "torch._dynamo" in sys.modules
    torch.manual_seed(0)
    theirs_model = _Net()
    theirs = nn.parallel.DistributedDataParallel(theirs_model)
    theirs_params = _train_ddp(theirs, theirs_model, rank)
    same = all(torch.equal(a, b) for a, b in zip(ours_params, theirs_params, strict=True))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(7))
    ours.eval()
    theirs.eval()
    again = torch.equal(ours(x), theirs(x))
    dist.destroy_process_group()
    result = {"compiler_after_ours": compiler, "same": same, "again": again}
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))


def save_then_hold_worker(root: str, async_save: bool, kill_at: str, out: str) -> None:
    """Saves step 1 (its model digest written to ``out``), then step 2 with a save-phase hook
    that holds the save once ``kill_at`` exists, for the test to SIGKILL this process there
    (tests/unit/train/test_checkpoint_kill.py)."""
    import time

    import train.checkpoint.manager as manager
    from train.checkpoint import CheckpointManager, capture_rng_state, model_digest

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = eager(torch.optim.SGD)(model.parameters(), lr=0.1, momentum=0.9)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=async_save)

    def step(n: int) -> None:
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        cm.save(
            n, {"optimizer": opt.state_dict()}, {"rng": capture_rng_state()},
            epoch=0, epoch_step=n, model=model,
        )  # fmt: skip

    step(1)
    cm.wait()
    Path(out + ".tmp").write_text(model_digest(model))
    os.replace(out + ".tmp", out)

    def hold(phase: str) -> None:
        if os.path.exists(kill_at):
            time.sleep(120)

    manager.SAVE_PHASE_HOOKS.append(hold)
    step(2)
    cm.wait()
    Path(out + ".unexpected").write_text("the save finished")


def start_process(fn: Callable[..., Any], *args: Any) -> multiprocessing.process.BaseProcess:
    """``fn(*args)`` in one process forked from the fork server (see the module docstring),
    started, not waited for: the caller may kill it."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    proc = ctx.Process(target=fn, args=args, daemon=True)
    proc.start()
    return proc


def compiler_modules() -> list[str]:
    """The modules of torch's compiler this process has imported."""
    return sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor")))


def resumed_imports_worker(rank: int, world: int, ports: tuple[int, int], run_dir: str) -> None:
    """A 2-rank DDP run of the built-in trainer to step 4, then its resume to step 6 in the same
    process (whatever either imported stays); writes what of the compiler was imported before
    the run (nothing: the fork server never imports it) and after the resume."""
    before = compiler_modules()
    cfg = TrainConfig.model_validate(
        {
            "model": "tinycnn", "width": 4, "data": {"train_size": 128, "test_size": 32},
            "batch_size": 32, "epochs": 2, "num_threads": 1, "strategy": "ddp",
        }
    )  # fmt: skip
    run = Path(run_dir)
    run_training(cfg, DistEnv.from_env(torchrun_env(rank, world, ports[0])), run, max_steps=4)
    # a new process group on another port: a rank done with the first must not find the first
    # one's store, which the other rank may not have closed yet
    env = DistEnv.from_env(torchrun_env(rank, world, ports[1]))
    result = run_training(cfg, env, run, max_steps=6, resume=True)
    out = {
        "before": before,
        "after": compiler_modules(),
        "resumed": result.steps == 6 and result.resumed_from is not None,
    }
    Path(run_dir, f"imports-{rank}.json").write_text(json.dumps(out))


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
