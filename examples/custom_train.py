"""Train your own model and data set with train's environment, checkpoints and preemption handling.

The spec (examples/custom.yaml) names this function as its entrypoint::

    entrypoint:
      function: "examples.custom_train:main"

and ``python -m train --config examples/custom.yaml`` (or ``python -m jobs submit ...``) calls
``main(ctx)`` on every rank after setting up the process group, the device, the checkpoint
manager and the stop-signal guard. The pattern to copy:

1. build the model on ``ctx.device``; wrap it in DDP when ``ctx.env.world_size > 1``;
2. ``ctx.load_resume()`` -> restore model/optimizer/position (None on a fresh start);
3. at every step boundary ``ctx.should_stop()`` (every rank): save, ``return ctx.requeue(step)``;
4. save every N steps and at the end with ``ctx.checkpoints.save(...)`` (every rank).

The data here: two interleaved 2-D spirals (3 classes), an MLP classifier. Settings come from the
spec's ``train`` section (batch_size, max_steps, optimizer.lr, seed, checkpoint.interval_steps).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from train.entry import TrainContext

log = logging.getLogger("examples.custom_train")


def spirals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points on 3 noisy spiral arms: inputs ``[n, 2]``, labels ``[n]``."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=gen)
    r = torch.rand(n, generator=gen)
    theta = 4.0 * r + labels * (2 * math.pi / 3) + 0.2 * torch.randn(n, generator=gen)
    x = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1)
    return x, labels


def make_model() -> nn.Module:
    """A small MLP: 2 -> 64 -> 64 -> 3."""
    return nn.Sequential(
        nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)
    )


def main(ctx: TrainContext) -> int:
    """Entry point: train the MLP, checkpointing and requeueing like the built-in trainer."""
    cfg = ctx.config.train
    env, device = ctx.env, ctx.device
    torch.manual_seed(cfg.seed)
    model = make_model().to(device)
    ddp = (
        nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if ctx.devices.cuda else None
        )
        if env.world_size > 1
        else model
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=min(cfg.optimizer.lr, 0.01))
    x, y = spirals(6000, cfg.seed)
    x_test, y_test = spirals(1000, cfg.seed + 1)
    per_rank = max(1, cfg.batch_size // env.world_size)
    total = cfg.max_steps or 600

    step = 0
    loaded = ctx.load_resume()
    if loaded is not None:
        model.load_state_dict(loaded.shared["model"])
        optimizer.load_state_dict(loaded.shared["optimizer"])
        step = loaded.step
        log.info("resumed at step %d from %s", step, loaded.path)

    def save(step: int) -> None:
        ctx.checkpoints.save(
            step,
            {"optimizer": optimizer.state_dict()},
            {"step": step},
            epoch=0,
            epoch_step=step,
            model=model,
        )

    gen = torch.Generator()
    while step < total:
        # Batch of step `step` on this rank: a function of (seed, step, rank) -> exact resume.
        gen.manual_seed(cfg.seed * 100_003 + step * 101 + env.rank)
        idx = torch.randint(0, x.shape[0], (per_rank,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x[idx].to(device)), y[idx].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if ctx.is_main and step % cfg.log_interval == 0:
            log.info("step %d/%d loss %.4f", step, total, loss.item())
        interval = cfg.checkpoint.interval_steps
        if interval and step % interval == 0:
            save(step)
        if ctx.should_stop():  # every rank, every step: ranks agree on stopping
            save(step)
            return ctx.requeue(step)

    with torch.no_grad():
        acc = (model(x_test.to(device)).argmax(1).cpu() == y_test).float().mean().item()
    if ctx.is_main:
        log.info("done: %d steps, test accuracy %.1f%%", step, 100 * acc)
        (ctx.run_dir / "result.txt").write_text(f"test_accuracy {acc:.4f}\n")
    save(step)
    return 0
