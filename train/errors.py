"""Errors raised by the train package (torch-free).

    TrainError             base: anything train reports to the user as one line
    ├── ConfigError        [2] invalid train/requeue/entrypoint sections or --set
    ├── EnvError           [2] inconsistent Slurm/torchrun environment (names the sbatch option)
    │   └── DeviceError    [2] GPUs allocated but CUDA unusable and CPU fallback off
    ├── DataError          [2] the data set is missing or malformed
    ├── EntrypointError    [2] the user's entrypoint function/command cannot be found or run
    ├── CheckpointError    [1] a checkpoint cannot be written, found or loaded
    └── TrainingError      [1] training failed (non-finite loss, collective failure, ...)

``exit_code`` ([n] above) is what ``python -m train`` returns for each class:
2 means "fix your input", 1 means "something went wrong while running".
"""

from __future__ import annotations


class TrainError(Exception):
    """Base class of every error raised by :mod:`train`."""

    exit_code: int = 1


class ConfigError(TrainError, ValueError):
    """The training configuration (YAML sections or ``--set`` overrides) is invalid."""

    exit_code = 2


class EnvError(TrainError):
    """The launch environment is inconsistent; the message names the option to change."""

    exit_code = 2


class DeviceError(EnvError):
    """Requested devices are not usable (e.g. GPUs allocated but CUDA is unavailable)."""


class DataError(TrainError):
    """The data set cannot be read."""

    exit_code = 2


class EntrypointError(TrainError):
    """The user's entrypoint cannot be imported or started."""

    exit_code = 2


class CheckpointError(TrainError):
    """A checkpoint could not be saved, found or restored."""


class TrainingError(TrainError):
    """Training failed while running."""
