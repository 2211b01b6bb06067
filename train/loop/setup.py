"""What the built-in training loop (:mod:`train.loop.trainer`) is built from.

- :func:`shard_data`: the train/test sets, how this world size splits each global batch
  (:mod:`train.loop.order`: the global batches depend on the seed, the epoch and the step only;
  a run resumed on fewer ranks accumulates more micro-steps) and the optimizer steps per epoch;
  a global batch that does not split over the ranks is a :class:`train.errors.ConfigError`;
- :func:`build_training_model`: the model (same initial weights on every rank), optionally
  channels-last and compiled, placed by its :class:`train.loop.strategies.Strategy`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.device import DeviceInfo
from train.env import DistEnv
from train.errors import ConfigError
from train.loop.data import ImageSet, load_data
from train.loop.models import build_model
from train.loop.order import BatchSplit, plan_split
from train.loop.strategies import Strategy, build_strategy
from train.runtime import Runtime
from train.spec import TrainConfig

__all__ = ["ShardedData", "build_training_model", "shard_data"]


@dataclass(frozen=True)
class ShardedData:
    """The data of one rank: both sets on the CPU, the batch split and the epoch's length."""

    train_set: ImageSet
    test_set: ImageSet
    split: BatchSplit  # micro-steps and images per micro-step on each rank
    steps_per_epoch: int  # optimizer steps (global batches), the same for every world size

    @property
    def micro(self) -> int:
        return self.split.micro


def shard_data(
    config: TrainConfig,
    env: DistEnv,
    rt: Runtime,
    reference_world: int | None = None,
    keep_micro: int | None = None,
) -> ShardedData:
    """Load the data (rank 0 first when it writes a synthetic set) and split the batch.

    ``keep_micro``: the micro-batch the resumed checkpoint was trained with (its manifest);
    else ``reference_world``: the world size whose planned micro-batch to keep (a checkpoint
    that records no split); None: this one (:func:`train.loop.order.plan_split`)."""
    split = plan_split(
        config.batch_size, env.world_size, config.grad_accum, reference_world, keep_micro=keep_micro
    )
    # Synthetic data with a path is written once (by rank 0) and read back by everyone.
    writes = config.data.kind == "synthetic" and bool(config.data.path)
    if writes and not env.is_main:
        rt.barrier()
    train_set, test_set = load_data(config.data, config.seed)
    if writes and env.is_main:
        rt.barrier()
    steps_per_epoch = len(train_set) // config.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"train.batch_size {config.batch_size} is larger than the training set "
            f"({len(train_set)} images): lower it or use more data"
        )
    return ShardedData(train_set, test_set, split, steps_per_epoch)


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
