"""Models chosen by ``train.model``: a ResNet-9-like CIFAR net and a tiny CNN for tests.

Both are ``nn.Sequential`` of blocks so the pipeline strategy can split them into stages at block
boundaries without knowing the architecture. ``norm="none"`` removes BatchNorm: with it, a
batch split across ranks / micro-batches / pipeline chunks gives exactly the gradients of the
whole batch, which is what the equivalence tests need (BatchNorm statistics are per batch).
"""

from __future__ import annotations

import itertools
from typing import Literal

import torch
from torch import nn

__all__ = ["Residual", "build_model", "resnet9", "split_stages", "tinycnn"]

Norm = Literal["batch", "none"]


def _conv_block(c_in: int, c_out: int, norm: Norm, pool: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm == "none")]
    if norm == "batch":
        layers.append(nn.BatchNorm2d(c_out))
    layers.append(nn.ReLU(inplace=True))
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class Residual(nn.Module):
    """``x + f(x)``: one block, so it is never cut in half by a pipeline split."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class _Scale(nn.Module):
    """Fixed output scaling (ResNet-9 DAWNBench trick: keeps initial logits small)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def resnet9(width: int = 16, num_classes: int = 10, norm: Norm = "batch") -> nn.Sequential:
    """ResNet-9 (Page's DAWNBench net) with base width ``width`` (64: the original 6.5M)."""
    w = width
    return nn.Sequential(
        _conv_block(3, w, norm),
        _conv_block(w, 2 * w, norm, pool=True),
        Residual(nn.Sequential(_conv_block(2 * w, 2 * w, norm), _conv_block(2 * w, 2 * w, norm))),
        _conv_block(2 * w, 4 * w, norm, pool=True),
        _conv_block(4 * w, 8 * w, norm, pool=True),
        Residual(nn.Sequential(_conv_block(8 * w, 8 * w, norm), _conv_block(8 * w, 8 * w, norm))),
        nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten()),
        nn.Sequential(nn.Linear(8 * w, num_classes, bias=False), _Scale(0.125)),
    )


def tinycnn(width: int = 16, num_classes: int = 10, norm: Norm = "batch") -> nn.Sequential:
    """Three conv blocks + linear head (~27k params at width 16): fast enough for CPU tests."""
    w = width
    return nn.Sequential(
        _conv_block(3, w, norm, pool=True),
        _conv_block(w, 2 * w, norm, pool=True),
        _conv_block(2 * w, 4 * w, norm, pool=True),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        nn.Linear(4 * w, num_classes),
    )


def build_model(
    name: str, width: int = 16, num_classes: int = 10, norm: Norm = "batch"
) -> nn.Sequential:
    """The model named in the spec (``resnet`` or ``tinycnn``)."""
    if name == "resnet":
        return resnet9(width, num_classes, norm)
    if name == "tinycnn":
        return tinycnn(width, num_classes, norm)
    raise ValueError(f"unknown model {name!r}: use 'resnet' or 'tinycnn'")


def split_stages(model: nn.Sequential, n: int) -> list[nn.Sequential]:
    """Cut ``model`` into ``n`` consecutive stages minimising the largest stage's parameters.

    Blocks are never split; every stage gets at least one block (``n`` is capped at the number of
    blocks). A small exact dynamic programme: models here have about ten blocks.
    """
    blocks = list(model.children())
    n = max(1, min(n, len(blocks)))
    sizes = [sum(p.numel() for p in b.parameters()) + 1 for b in blocks]
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    m = len(blocks)
    inf = float("inf")
    # best[k][i]: smallest max-stage cost splitting the first i blocks into k stages.
    best = [[inf] * (m + 1) for _ in range(n + 1)]
    cut = [[0] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for k in range(1, n + 1):
        for i in range(k, m + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds = [m]
    for k in range(n, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    return [nn.Sequential(*blocks[a:b]) for a, b in itertools.pairwise(bounds)]
