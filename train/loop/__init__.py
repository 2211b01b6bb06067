"""The built-in training loop (imports torch): CIFAR-10 or synthetic data, the models, the
strategies (ddp, dp, pipeline, single), the optimizer step and the loop itself, inside one
:class:`train.session.RunSession`.

Modules: :mod:`train.loop.trainer` (:func:`run_training`), :mod:`train.loop.data`,
:mod:`train.loop.models`, :mod:`train.loop.strategies`, :mod:`train.loop.optim`,
:mod:`train.loop.setup` (data sharding and the model for a strategy),
:mod:`train.loop.metrics` (``metrics.jsonl``, step timing, evaluation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.loop.data import describe_data
    from train.loop.models import build_model
    from train.loop.trainer import TrainResult, run_training

_EXPORTS = {
    "describe_data": "data",
    "build_model": "models",
    "TrainResult": "trainer",
    "run_training": "trainer",
}
__all__ = [
    "TrainResult",
    "build_model",
    "describe_data",
    "run_training",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
