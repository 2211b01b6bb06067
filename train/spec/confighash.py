"""The trajectory hash of a :class:`train.spec.config.TrainConfig` (torch-free).

Checkpoint manifests store it as ``spec_hash`` so that a resume with a different model, data or
optimizer is noticed; fields that only change paths, logging or resume policy are left out.
"""

from __future__ import annotations

import hashlib
import json

from train.spec.config import TrainConfig

__all__ = ["config_hash"]

# Fields that change paths, logging or resume policy, not the training trajectory.
_NOT_TRAJECTORY = set(
    "run_dir checkpoint log_interval eval_every_epochs allow_config_change wandb".split()  # noqa: SIM905
)


def config_hash(config: TrainConfig) -> str:
    """A short hash of the fields that change the training trajectory (not paths or logging).

    Stored in checkpoint manifests so a resume with a different model/data/optimizer is noticed.
    """
    data = config.model_dump(mode="json", exclude=_NOT_TRAJECTORY)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
