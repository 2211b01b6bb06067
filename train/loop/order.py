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

:func:`plan_split` keeps the micro-batch a resumed checkpoint was trained with (its manifest
records its split: :meth:`BatchSplit.to_json`), whatever the world size it was written at:
the memory a rank needs, and the composition of the global batch (consecutive micro-batches of
the same samples), so a resume on the same world size computes exactly what the run would have,
however many reshapes came before (2 ranks x 1 micro-step of 16 -> 1 rank x 2 micro-steps of
16 -> resumed again on 1 rank: still 2 of 16, never 1 of 32). Fewer ranks accumulate more
micro-steps; where the kept micro-batch does not divide a rank's share, the fewest micro-steps
no larger than it.
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

    def to_json(self) -> dict[str, int]:
        """What a checkpoint's manifest records of the split it was trained with."""
        return {"world_size": self.world, "grad_accum": self.grad_accum, "micro_batch": self.micro}


def plan_split(
    batch_size: int,
    world: int,
    grad_accum: int,
    reference_world: int | None = None,
    *,
    keep_micro: int | None = None,
) -> BatchSplit:
    """The split of ``batch_size`` over ``world`` ranks.

    ``keep_micro``: the micro-batch to keep (the one the resumed checkpoint was trained with,
    its manifest's split): kept where ``world`` ranks divide the batch into micro-batches of
    that size, else the fewest micro-steps whose micro-batch is no larger. Without it,
    ``grad_accum`` is the accumulation at ``reference_world`` ranks (the shape the run was
    planned or first written at; default: ``world``), whose micro-batch ``batch_size /
    (reference_world x grad_accum)`` is kept the same way when fewer ranks resume. At
    ``world == reference_world`` without ``keep_micro`` this is the plain ``batch_size /
    (world x grad_accum)``. A batch that no split fits is a ConfigError.
    """
    ref = max(world, reference_world or world)
    if keep_micro is None and (ref == world or batch_size % (ref * grad_accum)):
        if batch_size % (world * grad_accum):
            raise ConfigError(
                f"train.batch_size {batch_size} is not divisible by world size {world} x "
                f"train.grad_accum {grad_accum}: choose a multiple of {world * grad_accum}"
            )
        return BatchSplit(batch_size, world, grad_accum, batch_size // (world * grad_accum))
    if batch_size % world:
        planned = f"it was planned for {ref}" if keep_micro is None else "its checkpoint's split"
        raise ConfigError(
            f"train.batch_size {batch_size} does not split over the {world} ranks this run "
            f"resumed on ({planned}): resume on a world size that divides it"
        )
    limit = keep_micro if keep_micro is not None else batch_size // (ref * grad_accum)
    limit = max(1, min(limit, batch_size // world))
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
