"""What the built-in training loop (:mod:`train.loop.trainer`) is built from.

- :func:`shard_data`: the train/test sets and this rank's share of the training set (a
  :class:`DistributedSampler` reshuffled per epoch), the per-rank micro-batch and the optimizer
  steps per epoch; a global batch that does not split over ranks x ``grad_accum`` is a
  :class:`train.errors.ConfigError`;
- :func:`build_training_model`: the model (same initial weights on every rank), optionally
  channels-last and compiled, placed by its :class:`train.loop.strategies.Strategy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import DistributedSampler

from train.device import DeviceInfo
from train.env import DistEnv
from train.errors import ConfigError
from train.loop.data import ImageSet, load_data
from train.loop.models import build_model
from train.loop.strategies import Strategy, build_strategy
from train.runtime import Runtime
from train.spec.config import TrainConfig

__all__ = ["ShardedData", "build_training_model", "shard_data"]


@dataclass(frozen=True)
class ShardedData:
    """The data of one rank: both sets on the CPU, the sampler and the batch split."""

    train_set: ImageSet
    test_set: ImageSet
    sampler: DistributedSampler[int]
    micro: int  # images per micro-step on this rank
    steps_per_epoch: int  # optimizer steps


def shard_data(config: TrainConfig, env: DistEnv, rt: Runtime) -> ShardedData:
    """Load the data (rank 0 first when it writes a synthetic set) and split the batch."""
    world, k = env.world_size, config.grad_accum
    if config.batch_size % (world * k):
        raise ConfigError(
            f"train.batch_size {config.batch_size} is not divisible by world size {world} x "
            f"train.grad_accum {k}: choose a multiple of {world * k}"
        )
    micro = config.batch_size // (world * k)
    # Synthetic data with a path is written once (by rank 0) and read back by everyone.
    writes = config.data.kind == "synthetic" and bool(config.data.path)
    if writes and not env.is_main:
        rt.barrier()
    train_set, test_set = load_data(config.data, config.seed)
    if writes and env.is_main:
        rt.barrier()
    # The sampler only needs len(): it yields this rank's indices, reshuffled per epoch.
    sampler: DistributedSampler[int] = DistributedSampler(
        cast(Any, range(len(train_set))),
        num_replicas=world,
        rank=env.rank,
        shuffle=True,
        seed=config.seed,
        drop_last=True,
    )
    steps_per_epoch = len(sampler) // (micro * k)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"train.batch_size {config.batch_size} is larger than the training set "
            f"({len(train_set)} images): lower it or use more data"
        )
    return ShardedData(train_set, test_set, sampler, micro, steps_per_epoch)


def build_training_model(config: TrainConfig, devices: DeviceInfo, env: DistEnv) -> Strategy:
    """The model of ``config``, wrapped and placed by its strategy."""
    torch.manual_seed(config.seed)  # same initial weights on every rank and strategy
    model = build_model(config.model, config.width, norm=config.norm)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if config.compile:
        # In place (nn.Module.compile): state-dict keys stay free of "_orig_mod.".
        model.compile()
    return build_strategy(
        config.strategy,
        model,
        devices,
        env,
        sync_batchnorm=config.sync_batchnorm,
        pipeline_chunks=config.pipeline_chunks,
    )
