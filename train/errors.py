"""Errors raised by the train package (torch-free).

    TrainError             base: anything train reports to the user as one line
    ├── ConfigError        [2] invalid train/requeue/entrypoint sections or --set
    │   └── SpecError      [2] the spec loader's error (train.spec.load, shared with jobs): one line
    │       │                  per problem, ``file:line:column: field.path: problem (hint)``
    │       └── OverrideError [2] a ``--set key=value`` is malformed or names no field
    ├── EnvError           [2] inconsistent Slurm/torchrun environment (names the sbatch option)
    │   └── DeviceError    [2] GPUs allocated but CUDA unusable and CPU fallback off
    ├── DataError          [2] the data set is missing or malformed
    ├── EntrypointError    [2] the user's entrypoint function/command cannot be found or run
    ├── CheckpointError    [1] a checkpoint cannot be written, found or loaded
    └── TrainingError      [1] training failed (non-finite loss, collective failure, ...)

[2] marks the classes that also derive from :class:`cluster.errors.BadInputError`, the one
bad-input signal of every package: ``python -m train`` (and ``python -m jobs``) exit 2 for them,
1 for the others; a failure in a run is requeued, bad input is not (``train.stop.act``).
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster import BadInputError


class TrainError(Exception):
    """Base class of every error raised by :mod:`train`."""


class ConfigError(TrainError, BadInputError, ValueError):
    """The training configuration (YAML sections or ``--set`` overrides) is invalid."""


class SpecError(ConfigError):
    """One or more problems in a spec; ``str()`` is one line per problem (``lines``)."""

    def __init__(self, lines: Sequence[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


class OverrideError(SpecError):
    """A ``--set key=value`` that cannot be applied."""


class EnvError(TrainError, BadInputError):
    """The launch environment is inconsistent; the message names the option to change."""


class DeviceError(EnvError):
    """Requested devices are not usable (e.g. GPUs allocated but CUDA is unavailable)."""


class DataError(TrainError, BadInputError):
    """The data set cannot be read."""


class EntrypointError(TrainError, BadInputError):
    """The user's entrypoint cannot be imported or started."""


class CheckpointError(TrainError):
    """A checkpoint could not be saved, found or restored."""


class TrainingError(TrainError):
    """Training failed while running."""
