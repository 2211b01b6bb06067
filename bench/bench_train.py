"""Training throughput: our trainer against a minimal hand-written PyTorch loop.

Both sides train the same model (``train.loop.models.build_model``) on the same in-memory synthetic
CIFAR tensors (``train.loop.data.make_synthetic``), with the same global batch, optimizer (SGD,
Nesterov momentum, weight decay) and world size, one CPU thread per process:

- ``ours``: :func:`train.loop.trainer.run_training` (what ``python -m train`` runs), images/s as the
  trainer reports it (``TrainResult.images_per_s``: steps after ``WARMUP_STEPS``, evaluation and
  checkpoints excluded, its own per-step stop-flag all-reduce, metrics and scheduler included);
- ``hand``: :func:`hand_loop` below: index, normalise, forward, loss, backward, step, and
  ``DistributedDataParallel`` over gloo for two ranks; timed over the same steps after the
  same number of warm-up steps.

Augmentation is off on both sides (the hand loop has none): what is compared is the training
loop's own overhead; ``bench_data`` shows the augmentation pipeline separately.
One worker process per rank (two on 127.0.0.1 for DDP, one process group shared by both sides)
alternates ``ours`` and ``hand`` runs (ABBA), medians over the rounds after a warm-up round.
Worker mode (used by the parent): ``python -m bench.bench_train --rank R --rounds N ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Figure, Goal, Options, bench_env, free_port, interleave

__all__ = ["TrainSetup", "hand_loop", "run"]

SECTION = "Training throughput (CPU)"
GOAL = Goal(">=", 0.97)
#: Steps excluded from the measurement on both sides (train.loop.trainer.WARMUP_STEPS).
WARMUP_STEPS = 5


@dataclass(frozen=True)
class TrainSetup:
    """One comparison: model, global batch, world size, measured steps."""

    model: str = "tinycnn"
    width: int = 16
    batch: int = 128
    world: int = 1
    steps: int = 30
    lr: float = 0.05

    @property
    def train_size(self) -> int:
        # One epoch covers every step, so no epoch boundary falls inside the timed window.
        return (WARMUP_STEPS + self.steps + 2) * self.batch

    def argv(self) -> list[str]:
        return [
            f"--model={self.model}",
            f"--width={self.width}",
            f"--batch={self.batch}",
            f"--world={self.world}",
            f"--steps={self.steps}",
            f"--lr={self.lr}",
        ]


# -- the two sides (run inside worker processes) ------------------------------------------------
def ours(setup: TrainSetup, rank: int, run_dir: Path) -> float:
    """Images/s of :func:`train.loop.trainer.run_training` for ``setup`` (as rank ``rank``)."""
    from train.env import DistEnv
    from train.loop.trainer import WARMUP_STEPS as TRAINER_WARMUP
    from train.loop.trainer import run_training
    from train.spec.config import CheckpointConfig, DataConfig, OptimizerConfig, TrainConfig

    if TRAINER_WARMUP != WARMUP_STEPS:
        raise RuntimeError(f"train.loop.trainer.WARMUP_STEPS is {TRAINER_WARMUP}, bench assumes 5")
    config = TrainConfig(
        model=setup.model,  # type: ignore[arg-type]
        width=setup.width,
        data=DataConfig(kind="synthetic", train_size=setup.train_size, test_size=64, augment=False),
        optimizer=OptimizerConfig(name="sgd", lr=setup.lr, schedule="constant"),
        max_steps=WARMUP_STEPS + setup.steps,
        batch_size=setup.batch,
        strategy="ddp" if setup.world > 1 else "single",
        checkpoint=CheckpointConfig(interval_steps=0, keep_last=1, keep_best=False),
        seed=0,
        num_threads=1,
        eval_every_epochs=1000,
    )
    env = DistEnv.from_env(os.environ)
    result = run_training(config, env, run_dir, max_steps=WARMUP_STEPS + setup.steps)
    if result.images_per_s is None:
        raise RuntimeError("run_training reported no images/s")
    return float(result.images_per_s)


def hand_loop(setup: TrainSetup, rank: int, port: int) -> float:
    """Images/s of a plain PyTorch loop: the baseline people would write by hand."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from train.loop.data import CIFAR_MEAN, CIFAR_STD, make_synthetic
    from train.loop.models import build_model

    torch.set_num_threads(1)
    world = setup.world
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    data = make_synthetic(setup.train_size, seed=0, split="train", noise=0.5)
    torch.manual_seed(0)
    model: nn.Module = build_model(setup.model, setup.width)
    params = list(model.parameters())
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(params, lr=setup.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[rank::world]
    micro = setup.batch // world
    model.train()
    t0 = time.perf_counter()
    for step in range(WARMUP_STEPS + setup.steps):
        if step == WARMUP_STEPS:
            t0 = time.perf_counter()
        idx = order[step * micro : (step + 1) * micro]
        x = (data.images[idx].float() / 255.0 - mean) / std
        loss = nn.functional.cross_entropy(model(x), data.labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    return setup.steps * setup.batch / elapsed


# -- the parent: launch workers, report ------------------------------------------------------
def _launch(setup: TrainSetup, rounds: int, warmup: int, workdir: Path) -> dict[str, list[float]]:
    """One worker per rank; each alternates ours and hand in-process; rank 0's samples.

    Alternating inside long-lived workers (instead of a fresh process per sample) keeps
    process start-up out of the way, so more rounds fit and load drift hits both sides.
    """
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="train-", dir=workdir))
    out = run_dir / "result.json"
    procs = []
    for rank in range(setup.world):
        extra = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(setup.world),
            "LOCAL_WORLD_SIZE": str(setup.world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        argv = [
            sys.executable,
            "-m",
            "bench.bench_train",
            f"--rank={rank}",
            f"--rounds={rounds}",
            f"--warmup={warmup}",
            f"--run-dir={run_dir}",
            f"--out={out}",
            *setup.argv(),
        ]
        env = bench_env(extra if setup.world > 1 else None)
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
    timeout = 120.0 + 60.0 * (rounds + warmup) * setup.world
    errors = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            errors.append(f"timed out after {timeout:.0f}s")
            continue
        if p.returncode != 0:
            tail = [ln for ln in (err or "").strip().splitlines() if ln.strip()][-1:]
            errors.append(f"exit {p.returncode}: {' '.join(tail)}")
    if errors:
        raise RuntimeError(f"training workers (world {setup.world}): {'; '.join(errors)}")
    samples: dict[str, list[float]] = json.loads(out.read_text())
    return samples


def run(opts: Options) -> list[Figure]:
    """1 process and 2-rank DDP (gloo, 127.0.0.1): ours vs the hand loop, alternating."""
    workdir = opts.workdir / "train"
    workdir.mkdir(parents=True, exist_ok=True)
    # Per-round ratios on a shared 2-core machine scatter by +-10%; 11 rounds keep the
    # median of a 3% goal from hanging on one or two slow rounds.
    rounds = 3 if opts.quick else max(11, opts.repeats)
    steps = 15 if opts.quick else 40
    figures = []
    for world, batch in ((1, 128), (2, 256)):
        setup = TrainSetup(world=world, batch=batch, steps=steps)
        opts.log(f"train: world {world}, batch {batch}, {steps} steps x {rounds} rounds")
        samples = _launch(setup, rounds, opts.warmup, workdir)
        label = "1 process" if world == 1 else f"{world}-rank DDP (gloo, 127.0.0.1)"
        figures.append(
            Figure.measured(
                SECTION,
                f"images/s, {label}",
                "img/s",
                samples["ours"],
                samples["hand"],
                baseline_name="hand-written loop",
                goal=GOAL,
                note=(
                    f"{setup.model} w{setup.width}, global batch {batch}, 1 thread/rank, "
                    f"{steps} steps after {WARMUP_STEPS} warm-up, alternating in the same "
                    f"process(es), median of {rounds}"
                ),
            )
        )
    return figures


def _worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_train")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="tinycnn")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args(argv)
    setup = TrainSetup(a.model, a.width, a.batch, a.world, a.steps, a.lr)
    import torch.distributed as dist

    if setup.world > 1:
        # One process group for both sides: run_training uses an existing group as it is.
        dist.init_process_group("gloo", init_method="env://", rank=a.rank, world_size=a.world)
    count = {"ours": 0}

    def measure_ours() -> float:
        count["ours"] += 1
        return ours(setup, a.rank, a.run_dir / f"ours-{count['ours']}")

    samples = interleave(
        {"ours": measure_ours, "hand": lambda: hand_loop(setup, a.rank, 0)},
        repeats=a.rounds,
        warmup=a.warmup,
    )
    if setup.world > 1:
        dist.destroy_process_group()
    if a.rank == 0:
        a.out.write_text(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
