"""Optimizer and learning-rate schedule from ``train.optimizer`` (stepped once per optimizer step).

The schedule is a pure function of the step (``LambdaLR``), so its checkpointed state is just the
step counter and a resumed run follows the same curve.

The optimizers are torch's, without their import of ``torch._dynamo`` (:func:`eager`): every
``step`` of a torch optimizer imports it for a ``graph_break()`` that does nothing outside
``torch.compile``, and that import alone costs about as much as ``import torch`` (measured with
``python -X importtime``): the largest part of a requeued job's time to its first step.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from train.loop.nocompile import compiler_imported, disable_on_demand

if TYPE_CHECKING:  # the spec models (pydantic) are not imported by a script that uses eager
    from train.spec import OptimizerConfig

__all__ = ["build_optimizer", "build_scheduler", "eager", "lr_factor"]

# Optimizer methods wrapped by torch._disable_dynamo, which imports torch._dynamo on first call.
_DISABLE_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


_O = TypeVar("_O", bound=torch.optim.Optimizer)
_EAGER: dict[type, type] = {}


def eager(cls: type[_O]) -> type[_O]:
    """``cls`` with a ``step`` that does not import ``torch._dynamo`` when nothing compiles.

    torch's ``step`` runs under ``_use_grad_for_differentiable``: grad mode set to
    ``defaults["differentiable"]`` around a ``torch._dynamo.graph_break()`` (a no-op outside
    ``torch.compile``, but its import is ~1x ``import torch``). This ``step`` sets the same grad
    mode around the same undecorated ``step``; under ``torch.compile`` or once ``torch._dynamo``
    is imported anyway, torch's own ``step`` runs. The ``_disable_dynamo`` wrappers of
    :data:`_DISABLE_WRAPPED` get their answer up front
    (:func:`train.loop.nocompile.disable_on_demand`). A torch whose optimizers look different
    is left alone (only the speed-up is lost).
    """
    if cls in _EAGER:
        return _EAGER[cls]
    raw: Any = inspect.unwrap(cls.step)
    if raw is cls.step or compiler_imported():
        return cls
    for name in _DISABLE_WRAPPED:
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(fn):
            disable_on_demand(fn, recursive=True)

    torch_step: Any = cls.__dict__.get("step", cls.step)
    if getattr(torch_step, "hooked", False):  # Optimizer's profiling wrapper, added per class
        torch_step = torch_step.__wrapped__

    def step(self: Any, closure: Any = None) -> Any:
        if compiler_imported() or torch.compiler.is_compiling():
            return torch_step(self, closure)
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            return raw(self, closure)

    sub = type(cls.__name__, (cls,), {"step": step, "__module__": cls.__module__})
    _EAGER[cls] = sub
    return sub


def build_optimizer(config: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD (Nesterov momentum by default) or AdamW over ``model``'s parameters, in order."""
    params = list(model.parameters())
    if config.name == "adamw":
        return eager(torch.optim.AdamW)(params, lr=config.lr, weight_decay=config.weight_decay)
    return eager(torch.optim.SGD)(
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
