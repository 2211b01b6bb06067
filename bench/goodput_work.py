"""The one DDP workload every row of ``bench/bench_goodput.py`` trains, in each peer's habit.

A tiny model (8 -> 16 -> 1), DDP over gloo, and a fixed time per step: each step's compute is
padded with a sleep to ``--step-time`` seconds, standing in for a real model on this 2-core
machine. Rank 0 appends one line per step to ``RUN/progress.jsonl`` (``time``, ``step``,
``attempt``): what the bench reads (steps redone, the first step after a restart).

    python -m bench.goodput_work plain RUN --steps N    # the README's recipe (entrypoint.command)
    python -m bench.goodput_work trap RUN --steps N     # sbatch habit: periodic saves, no handler
    python -m bench.goodput_work lightning RUN ...      # Lightning + SLURMEnvironment(auto_requeue)
    python -m bench.goodput_work nosignal RUN ...       # no stop handling at all (the limit)

submitit's row pickles :class:`SubmititWork` (a ``submitit.helpers.Checkpointable``). The
built-in trainer's row pads ``train.loop.trainer._Loop.train_step`` the same way
(``bench/goodput_hook/sitecustomize.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SubmititWork", "main"]

_STOP = [False]
_LOADED = time.time()  # this module's import: the interpreter's start, give or take ~50 ms


def process_start() -> float | None:
    """This process's start on the wall clock (10 ms ticks): its start after boot
    (``/proc/self/stat``, field 22) against the boot clock now. Under our supervisor that is
    the user's interpreter; under submitit, ``submitit.core._submit``'s, which runs the task."""
    try:
        after_paren = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = int(after_paren[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError):
        return None


def _on_stop(signum: int, frame: object) -> None:
    _STOP[0] = True  # only a flag: the loop stops at a step boundary


def _dist_env(env: dict[str, str]) -> tuple[int, int]:
    """RANK/WORLD_SIZE (set by our supervisor, or by submitit's helper), else the Slurm step's
    (train.env: the one reader of SLURM_*); MASTER_ADDR/PORT exported for env://."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    from train.env import DistEnv

    d = DistEnv.from_env(env)
    os.environ.update(
        RANK=str(d.rank),
        WORLD_SIZE=str(d.world_size),
        LOCAL_RANK=str(d.local_rank),
        MASTER_ADDR=d.master_addr,
        MASTER_PORT=str(d.master_port),
    )
    return d.rank, d.world_size


class Loop:
    """The model, its optimizer, the step, the checkpoint and the progress file."""

    def __init__(self, run: Path, step_s: float, attempt: int, *, eager: bool = False) -> None:
        import torch
        import torch.distributed as dist
        from torch import nn

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        self.rank, self.world = _dist_env(dict(os.environ))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", init_method="env://")
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        ddp: Any = nn.parallel.DistributedDataParallel
        sgd: Any = torch.optim.SGD
        if eager:  # the README's recipe: DDP and optimizer without importing torch's compiler
            from train.loop.optim import eager as eager_optimizer
            from train.loop.strategies import eager_ddp as ddp

            sgd = eager_optimizer(sgd)
        self.ddp = ddp(self.model) if self.world > 1 else self.model
        self.opt = sgd(self.model.parameters(), lr=0.05)
        self.x = torch.randn(32, 8)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()
        self.run, self.step_s, self.attempt = run, step_s, attempt
        self.ckpt = run / "ckpt.pt"
        self.step = 0
        self._first = True
        if self.ckpt.exists():
            state = torch.load(self.ckpt, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.step = int(state["step"])
        self._progress = open(run / "progress.jsonl", "a") if self.rank == 0 else None  # noqa: SIM115

    def record(self, **fields: Any) -> None:
        if self._progress is not None:
            line = {"time": time.time(), "attempt": self.attempt, **fields}
            self._progress.write(json.dumps(line) + "\n")
            self._progress.flush()

    def train_step(self) -> None:
        t0 = time.perf_counter()
        loss = self.torch.nn.functional.binary_cross_entropy_with_logits(self.ddp(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        time.sleep(max(0.0, self.step_s - (time.perf_counter() - t0)))
        self.step += 1
        if self._first:  # this process's start, in its own CPU time: what no load changes
            self._first = False
            use = resource.getrusage(resource.RUSAGE_SELF)
            self.record(step=self.step, cpu_s=round(use.ru_utime + use.ru_stime, 3),
                        start_s=round(time.time() - _LOADED, 3),
                        process_start=process_start())  # fmt: skip
        else:
            self.record(step=self.step)

    def save(self, barrier: bool = True) -> None:
        if self.rank == 0:
            tmp = self.ckpt.with_name(f"ckpt.{os.getpid()}.tmp")
            state = {"model": self.model.state_dict(), "opt": self.opt.state_dict()}
            self.torch.save({**state, "step": self.step}, tmp)
            os.replace(tmp, self.ckpt)
        if barrier and self.world > 1:
            self.dist.barrier()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
        if self.world > 1 and self.dist.is_initialized():
            del self.ddp  # before the group: see examples/byo/plain_ddp.py
            self.dist.destroy_process_group()


def _attempt(env: dict[str, str]) -> int:
    return int(env.get("TRAIN_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT") or 0)


def run_plain(run: Path, steps: int, step_s: float, *, recipe: bool = True) -> int:
    """The README's recipe for ``entrypoint.command``: a flag set by the signal, agreed on by
    a lagged all-reduce (started after step k, read after step k+1: it overlaps the step, so
    it costs nothing measurable), then save and exit 0; the supervisor requeues. Its DDP and
    optimizer are ``eager_ddp`` and ``eager`` (the recipe's one import from this project);
    every peer's row keeps torch's. ``recipe=False`` (habit ``bare``, issue 46): a script that
    follows no recipe of ours: torch's own DDP and optimizer, its own ``torch.save``, a flag
    set by its signal handler, and the interpreter's exit as it comes (no ``gc.freeze``)."""
    signal.signal(signal.SIGUSR1, _on_stop)
    loop = Loop(run, step_s, _attempt(dict(os.environ)), eager=recipe)
    torch, dist = loop.torch, loop.dist
    pending: Any = None
    flag = torch.zeros(1)
    while loop.step < steps:
        loop.train_step()
        if loop.world > 1:
            if pending is not None:
                pending.wait()
                if flag.item() > 0:
                    break
            flag = torch.tensor([1.0 if _STOP[0] else 0.0])
            pending = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        elif _STOP[0]:
            break
    if pending is not None:
        pending.wait()
    loop.save()
    loop.record(event="saved" if loop.step < steps else "done")
    loop.close()
    if recipe:
        gc.freeze()  # the interpreter's exit then skips collecting torch's objects: 0.4 -> 0.1 s
    return 0


def run_periodic(run: Path, steps: int, step_s: float, save_every: int) -> int:
    """The hand-written sbatch habit (and, with ``save_every`` 0, no stop handling at all):
    saves every ``save_every`` steps; the batch script's trap requeues the job."""
    loop = Loop(run, step_s, _attempt(dict(os.environ)))
    while loop.step < steps:
        loop.train_step()
        if save_every and loop.step % save_every == 0 and loop.step < steps:
            loop.save()
    loop.record(event="done")
    loop.close()
    return 0


class SubmititWork:
    """submitit's habit: a ``Checkpointable`` whose ``checkpoint()`` saves and resubmits
    itself (submitit calls it on rank 0 from its USR2 handler, then requeues the job)."""

    def __init__(self, run: str, steps: int, step_s: float) -> None:
        self.run, self.steps, self.step_s = run, steps, step_s
        self._loop: Loop | None = None

    def __call__(self) -> int:
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)
        self._loop = loop = Loop(Path(self.run), self.step_s, _attempt(dict(os.environ)))
        while loop.step < self.steps:
            loop.train_step()
        loop.record(event="done")
        loop.close()
        return 0

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        if self._loop is not None:
            self._loop.save(barrier=False)  # in the signal handler: no collective
        fresh = SubmititWork(self.run, self.steps, self.step_s)
        return submitit.helpers.DelayedSubmission(fresh, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"run": self.run, "steps": self.steps, "step_s": self.step_s, "_loop": None}


def run_lightning(run: Path, steps: int, step_s: float) -> int:
    """Lightning's own Slurm support as its documentation shows it: ``srun python script.py``
    under sbatch with ``--signal=SIGUSR1@90``, ``SLURMEnvironment(auto_requeue=True)``; it
    saves an hpc checkpoint and requeues at the signal, and resumes from it on the next start."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.plugins.environments import SLURMEnvironment
    from pytorch_lightning.strategies import DDPStrategy
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    attempt = _attempt(dict(os.environ))

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch: Any, idx: int) -> Any:
            t0 = time.perf_counter()
            x, y = batch
            loss = nn.functional.binary_cross_entropy_with_logits(self.net(x), y)
            self._pad = (t0, loss)
            return loss

        def on_train_batch_end(self, outputs: Any, batch: Any, idx: int) -> None:
            t0, _ = self._pad
            time.sleep(max(0.0, step_s - (time.perf_counter() - t0)))
            if self.global_rank == 0:
                with open(run / "progress.jsonl", "a") as f:
                    line = {"time": time.time(), "attempt": attempt, "step": self.global_step}
                    f.write(json.dumps(line) + "\n")

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(32 * steps, 8)
    data = TensorDataset(x, (x.sum(dim=1, keepdim=True) > 0).float())
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=int(os.environ.get("SLURM_NNODES", "1")),
        strategy=DDPStrategy(process_group_backend="gloo"),
        plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)],
        max_steps=steps,
        default_root_dir=str(run),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), DataLoader(data, batch_size=32))
    if trainer.global_rank == 0:
        with open(run / "progress.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "attempt": attempt, "event": "done"}) + "\n")
    if torch.distributed.is_initialized():  # examples/byo/lightning_train.py says why
        torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.goodput_work")
    p.add_argument("habit", choices=("plain", "bare", "trap", "lightning", "nosignal"))
    p.add_argument("run", type=Path)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=50)
    a = p.parse_args(argv)
    if a.habit in ("plain", "bare"):
        return run_plain(a.run, a.steps, a.step_time, recipe=a.habit == "plain")
    if a.habit == "lightning":
        return run_lightning(a.run, a.steps, a.step_time)
    return run_periodic(a.run, a.steps, a.step_time, a.save_every if a.habit == "trap" else 0)


if __name__ == "__main__":
    sys.exit(main())
