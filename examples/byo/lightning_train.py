"""A plain Lightning script: nothing from this project imported, nothing Slurm-specific in it.

Under ``entrypoint: {command: [python, examples/byo/lightning_train.py]}``
(examples/byo/lightning.yaml):

- Lightning detects Slurm (``SLURMEnvironment``: ranks from SLURM_PROCID, ``num_nodes`` must
  match the job's nodes) and installs a SIGUSR1 handler that saves ``hpc_ckpt_N.ckpt`` in
  ``default_root_dir`` and runs ``scontrol requeue`` itself;
- the job sends it SIGUSR1 once at a preemption or before the time limit (``stop_signal: auto``
  sees the handler), records the interruption, and does not requeue a second time;
- ``default_root_dir`` defaults to ``$RUN_DIR`` (the job exports ``PL_TRAINER_DEFAULT_ROOT_DIR``),
  so on the next start ``trainer.fit`` finds and restores the hpc checkpoint by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.step_time = step_time

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_time)  # stands in for a real model on this small machine
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Progress(pl.Callback):
    """One JSON line per step (rank 0) in $RUN_DIR/progress.jsonl, for humans and tests."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.restart = int(os.environ.get("TRAIN_RESTART_COUNT", "0"))

    def _write(self, trainer: pl.Trainer, **fields: object) -> None:
        if trainer.is_global_zero:
            with self.path.open("a") as f:
                f.write(json.dumps({"time": time.time(), "restart": self.restart, **fields}) + "\n")

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._write(trainer, event="start", step=trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self._write(trainer, step=trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._write(trainer, event="done", step=trainer.global_step)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0)
    x = torch.randn(1024, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32, shuffle=True)
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    run_dir = Path(os.environ.get("RUN_DIR", "runs/lightning"))
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=nodes,
        strategy="ddp" if nodes > 1 else "auto",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Progress(run_dir / "progress.jsonl")],
    )
    trainer.fit(Tiny(args.step_time), data)
    if torch.distributed.is_initialized():
        # Lightning leaves the process group to the interpreter's exit, where torch 2.13's gloo
        # can abort the finished process ("terminate called without an active exception"):
        # a SIGABRT the job must count as a failure. Destroy it while Python still runs.
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
