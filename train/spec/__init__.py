"""The job spec's torch-free half, read by ``jobs`` (the command line) and ``train`` (inside the
allocation) alike: the same file gives the same answer, or the same one-line error, on both paths.

Modules: :mod:`train.spec.base` (the one strict pydantic base), :mod:`train.spec.config` (the
``train:`` section and the run's config), :mod:`train.spec.policy` (``requeue:`` and
``entrypoint:``), :mod:`train.spec.load` (reading a spec file safely, ``--set`` overrides, the
writer), :mod:`train.spec.yamlsafe` (YAML 1.2 core rules, caps, positions),
:mod:`train.spec.messages` (``file:line:column: field: problem (hint)``),
:mod:`train.spec.confighash` (which fields alter training: the resume check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.spec.base import StrictModel
    from train.spec.config import (
        EntrypointConfig,
        RequeueConfig,
        RunConfig,
        TrainConfig,
        load_run_config,
    )
    from train.spec.confighash import config_hash
    from train.spec.load import dump_spec, read_spec_file
    from train.spec.messages import validate
    from train.spec.policy import launches_torchrun

_EXPORTS = {
    "RunConfig": "config",
    "TrainConfig": "config",
    "RequeueConfig": "config",
    "EntrypointConfig": "config",
    "load_run_config": "config",
    "StrictModel": "base",
    "read_spec_file": "load",
    "dump_spec": "load",
    "config_hash": "confighash",
    "launches_torchrun": "policy",
    "validate": "messages",
}
__all__ = [
    "EntrypointConfig",
    "RequeueConfig",
    "RunConfig",
    "StrictModel",
    "TrainConfig",
    "config_hash",
    "dump_spec",
    "launches_torchrun",
    "load_run_config",
    "read_spec_file",
    "validate",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
