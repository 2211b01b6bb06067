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
        DataConfig,
        EntrypointConfig,
        OptimizerConfig,
        RequeueConfig,
        RunConfig,
        TrainConfig,
        check_sections,
        load_run_config,
    )
    from train.spec.confighash import config_hash
    from train.spec.load import (
        Override,
        dump_spec,
        load_source,
        read_spec_file,
        set_path,
        set_text,
        where,
    )
    from train.spec.messages import FieldIssue, error_lines, resolve_field, validate
    from train.spec.policy import launches_torchrun
    from train.spec.yamlsafe import Source

_EXPORTS = {
    "StrictModel": "base",
    "DataConfig": "config",
    "EntrypointConfig": "config",
    "OptimizerConfig": "config",
    "RequeueConfig": "config",
    "RunConfig": "config",
    "TrainConfig": "config",
    "load_run_config": "config",
    "check_sections": "config",
    "config_hash": "confighash",
    "Override": "load",
    "dump_spec": "load",
    "load_source": "load",
    "read_spec_file": "load",
    "set_path": "load",
    "set_text": "load",
    "where": "load",
    "FieldIssue": "messages",
    "error_lines": "messages",
    "resolve_field": "messages",
    "launches_torchrun": "policy",
    "validate": "messages",
    "Source": "yamlsafe",
}
__all__ = [
    "DataConfig",
    "EntrypointConfig",
    "FieldIssue",
    "OptimizerConfig",
    "Override",
    "RequeueConfig",
    "RunConfig",
    "Source",
    "StrictModel",
    "TrainConfig",
    "check_sections",
    "config_hash",
    "dump_spec",
    "error_lines",
    "launches_torchrun",
    "load_run_config",
    "load_source",
    "read_spec_file",
    "resolve_field",
    "set_path",
    "set_text",
    "validate",
    "where",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
