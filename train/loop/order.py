"""The data order of the built-in trainer: global batches that do not depend on the world size.

The sequence of global batches is a function of (seed, epoch, step) only: epoch ``e`` is one
permutation of the training set (``torch.randperm`` seeded with ``seed + e``, the generator
``DistributedSampler`` uses), cut into ``steps_per_epoch`` consecutive global batches of
``batch_size`` samples (the remainder is dropped). The world size and the accumulation only
decide who computes which slice of a global batch: rank ``r`` of ``W`` takes the contiguous
slice ``[r * B / W, (r + 1) * B / W)``, and its micro-step ``m`` the ``m``-th ``micro`` samples of
that slice. So a run saved on N ranks resumes on M ranks at the same step with the same global
batches: no sample of the epoch is repeated or skipped, and a model whose loss is a mean over
samples (no BatchNorm) gets the same gradients up to the float reduction order.

:func:`plan_split` keeps the per-rank micro-batch the run was planned with (the memory a rank
needs) when fewer ranks must produce the same global batch: gradient accumulation makes up the
difference (2 ranks x 1 micro-step of 64 -> 1 rank x 2 micro-steps of 64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.errors import ConfigError

__all__ = ["BatchSplit", "epoch_batches", "plan_split"]


@dataclass(frozen=True)
class BatchSplit:
    """How ``world`` ranks compute one global batch of ``batch_size``: ``grad_accum``
    micro-steps of ``micro`` samples each (``batch_size = world x grad_accum x micro``)."""

    batch_size: int
    world: int
    grad_accum: int
    micro: int

    @property
    def per_rank(self) -> int:
        """Samples of one global batch that one rank computes."""
        return self.grad_accum * self.micro

    def rank_slice(self, rank: int) -> slice:
        """Rank ``rank``'s positions in a global batch (contiguous)."""
        return slice(rank * self.per_rank, (rank + 1) * self.per_rank)


def plan_split(
    batch_size: int, world: int, grad_accum: int, reference_world: int | None = None
) -> BatchSplit:
    """The split of ``batch_size`` over ``world`` ranks.

    ``grad_accum`` is the accumulation at ``reference_world`` ranks (the shape the run was
    planned or first written at; default: ``world``). Its micro-batch ``batch_size /
    (reference_world x grad_accum)`` is kept when ``world`` divides the difference; otherwise
    the fewest micro-steps whose micro-batch is no larger. At ``world == reference_world``
    this is the plain ``batch_size / (world x grad_accum)``, so a run that keeps its shape
    computes exactly what it computed before. A batch that no split fits is a ConfigError.
    """
    ref = max(world, reference_world or world)
    if ref == world or batch_size % (ref * grad_accum):
        if batch_size % (world * grad_accum):
            raise ConfigError(
                f"train.batch_size {batch_size} is not divisible by world size {world} x "
                f"train.grad_accum {grad_accum}: choose a multiple of {world * grad_accum}"
            )
        return BatchSplit(batch_size, world, grad_accum, batch_size // (world * grad_accum))
    if batch_size % world:
        raise ConfigError(
            f"train.batch_size {batch_size} does not split over the {world} ranks this run "
            f"resumed on (it was planned for {ref}): resume on a world size that divides it"
        )
    limit = batch_size // (ref * grad_accum)
    k = -(-batch_size // (world * limit))  # the fewest micro-steps of at most `limit` samples
    while batch_size % (world * k):
        k += 1
    return BatchSplit(batch_size, world, k, batch_size // (world * k))


def epoch_batches(n: int, *, seed: int, epoch: int, batch_size: int, steps: int) -> torch.Tensor:
    """The global batches of epoch ``epoch``: ``int64 [steps, batch_size]`` sample indices, the
    same for every world size (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=gen)
    return perm[: steps * batch_size].view(steps, batch_size)
