"""Optimizer and learning-rate schedule from ``train.optimizer`` (stepped once per optimizer step).

The schedule is a pure function of the step (``LambdaLR``), so its checkpointed state is just the
step counter and a resumed run follows the same curve.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from train.config import OptimizerConfig

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def build_optimizer(config: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD (Nesterov momentum by default) or AdamW over ``model``'s parameters, in order."""
    params = list(model.parameters())
    if config.name == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        params,
        lr=config.lr,
        momentum=config.momentum,
        nesterov=config.nesterov and config.momentum > 0,
        weight_decay=config.weight_decay,
    )


def lr_factor(config: OptimizerConfig, step: int, total: int) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps of ``total``.

    constant/cosine: linear warm-up over ``warmup_steps``, then flat / half-cosine to 0.
    onecycle: linear from 1/25 up to 1 over ``warmup_steps`` (default 30% of the run), then
    linearly down to 0 (the DAWNBench ResNet-9 recipe).
    """
    total = max(total, 1)
    if config.schedule == "onecycle":
        peak = config.warmup_steps or max(1, int(0.3 * total))
        if step < peak:
            return 0.04 + 0.96 * step / peak
        return max(0.0, (total - step) / max(total - peak, 1))
    warm = config.warmup_steps
    if warm and step < warm:
        return (step + 1) / warm
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warm) / max(total - warm, 1))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    config: OptimizerConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` following :func:`lr_factor` over ``total_steps``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step, total_steps)
    )
